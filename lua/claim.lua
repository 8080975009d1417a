--[[
  claim: pop up to K pending ids; each becomes active with a fresh lease token
  and deadline, its attempt counted. docs/explanation/protocol.md#claim. Keeps the queue's
  wake marker true (lib/claimable.lua, docs/explanation/no-polling.md): it is put back when
  jobs are left pending, so the next idle worker wakes too, and removed when
  this call drained pending, so no worker wakes for nothing.

  KEYS[1] pending list         P:{q}:pending
  KEYS[2] active zset          P:{q}:active (score: lease deadline, ms)
  KEYS[3] lease sequence       P:{q}:lease:seq (string counter)
  KEYS[4] the claim it yields to: P:{q}:claim:<its own token> (none), or,
          for one of a pair sent in the same round trip on one server (the
          worker's or_else), the other's memo P:{q2}:claim:<token> (another
          queue's slot): when it exists (the other leased jobs, or a resend
          or replay finds it has) this one takes nothing and writes nothing;
          its own memo, checked first, still replays what it leased
          (docs/explanation/no-polling.md#a-sibling-rides-in-the-parents-slot)

  ARGV[1] queue key prefix     P:{q}: (job rows are P:{q}:job:<id>, same slot)
  ARGV[2] count K (integer >= 1)
  ARGV[3] now (ms); with a sliding rate limit, the log's newest start when
          that is later (a job's started_at is the log's time)
  ARGV[4] lease length (ms)
  ARGV[5] call token: a fresh random string per claim call; the reply is kept
          under P:{q}:claim:<token> for the lease length, so a replay of the
          same call (redis-py re-sends a command whose reply was lost, or a
          worker asks again with the token of a claim that raised) gets the
          same jobs instead of leasing a second batch
  ARGV[6] rate limit: at most this many claims per window ('0' = no limit),
          counted for all workers in the hash P:{q}:limiter {start, n}
          (docs/explanation/protocol.md#scheduling RATE_LIMIT)
  ARGV[7] rate window (ms): in 'fixed' mode a window opens at the first
          claim after the last one closed; in 'sliding' mode it is every
          interval of this length
  ARGV[8] rate mode: 'fixed' (the hash P:{q}:limiter {start, n}) or
          'sliding' (the zset P:{q}:limiter:log, lease token -> start (ms),
          trimmed to the window: no interval of ARGV[7] ms starts more than
          ARGV[6]; at most ARGV[6] members, expiring with the window; and
          the counter P:{q}:limiter:log:turn, which spreads refused claims'
          waits over the starts that will leave, expiring likewise)
  ARGV[9] concurrency cap from the settings ('0' = none): at most this many
          jobs active at once (the size of P:{q}:active, stalled leases
          included until recovered); P:{q}:concurrency, when set
          (emq.set_concurrency), wins (docs/explanation/protocol.md#concurrency)
  ARGV[10] queue name (an expired job's death names it: lib/flow.lua)
  ARGV[11] GROUP_CONCURRENCY from the settings ('0' = none): at most this many
          jobs of one group active at once; P:{q}:groups:concurrency's entry
          for the group, when set, wins (lib/groups.lua)
  ARGV[12] GROUP_RATE_LIMIT from the settings, 'max:per_ms' ('' = none): a
          fixed window per group; P:{q}:groups:rate's entry wins

  Expiry before start (docs/howto/retries.md#expiry-before-start): a popped
  job that never started (no `started_at`) whose row holds `expires_at`
  (ms) <= now is not leased: it dies with
  the error 'expired' (lib/flow.lua kill: its parent's policy applies, here
  or through the outbox), and the call pops the next ones in its place, at
  most EXPIRED_BUDGET deaths per call (the wake marker stays true when more
  is left). No scan: only the jobs a claim pops are looked at.

  Order (docs/explanation/protocol.md#scheduling): priorities > 0 (P:{q}:prioritized, scores < 0, see
  lib/claimable.lua), then the pending list (priority 0), then priorities < 0;
  FIFO within a priority. A paused queue (P:{q}:paused) gives nothing.
  Then the groups (docs/explanation/protocol.md#groups): one job per group
  per turn from the ring P:{q}:groups, each group's jobs in the same order
  (lib/groups.lua pop_groups); a queue whose jobs name no group has no ring
  and pays nothing for it.

  Emits one `active` entry on P:{q}:events (lib/emit.lua) per call that
  leased jobs, naming their ids space-separated: one XADD per claim, not per
  job (docs/explanation/protocol.md#events).

  returns: a JSON array (one bulk string: the host decodes it in one C call
           instead of parsing 15 replies per job), 15 entries per claimed job:
           id, lease token, name, payload, attempts, max_attempts, backoff_ms,
           parent, parent_queue, parent_policy, created_at, timeout_ms, priority,
           traceparent, retry_policy (the job's own, JSON: core/retry.py)
           (strings; an absent field is false);
           '{"paused":1}' when the queue is paused, '{"wait":ms}' when the
           rate limit's window is full (ms until it opens) and a job is
           claimable ('[]' when none is: nothing to wait for), '{"full":1}'
           when the concurrency cap is reached and a job is claimable (the
           full mark P:{q}:full is set and the wake marker removed: the
           next job to leave active wakes a worker, lib/claimable.lua
           left_active); a replay answers
           '{"left":ms,"jobs":[...]}': the first call's array and the ms its
           leases have left; a call that killed jobs past their expires_at
           answers '{"jobs":[...],"expired":[id, name, ...]}' (its replay
           answers as any replay: its jobs, not what expired)
  errors:  none; an id whose row is gone or not pending is dropped silently
           (it was removed by retention or already moved by another path)
]]
local pending, active = KEYS[1], KEYS[2]
local base, count, now = ARGV[1], tonumber(ARGV[2]), ARGV[3]
-- the lease deadline, as text once: a number argument is formatted again at every use
local deadline = string.format('%d', tonumber(now) + tonumber(ARGV[4]))
local QUEUE = ARGV[10]
local EXPIRED_BUDGET = 1000  -- expired jobs killed per call at most

-- @include lib/flow.lua

local memo = base .. 'claim:' .. ARGV[5]
local replayed = redis.call('GET', memo)
if replayed then
  return '{"left":' .. redis.call('PTTL', memo) .. ',"jobs":' .. replayed .. '}'
end
if KEYS[4] ~= memo and redis.call('EXISTS', KEYS[4]) == 1 then
  return '[]'  -- the claim before it leased: its slot is taken
end
if redis.call('EXISTS', base .. 'paused') == 1 then
  redis.call('ZREM', base .. 'wake', WAKE_NOW)  -- resume wakes the workers again
  return '{"paused":1}'
end
-- what may still start: the concurrency cap, then the rate limit, both by
-- the host's clock (docs/explanation/protocol.md#the-hosts-clock)
local function claimable()
  return redis.call('EXISTS', pending, base .. 'prioritized', base .. 'groups') > 0
end
local cap = tonumber(redis.call('GET', base .. 'concurrency') or ARGV[9])
local free = -1  -- -1: no cap
if cap > 0 then
  free = cap - redis.call('ZCARD', active)
  if free <= 0 then
    if not claimable() then
      return '[]'
    end
    redis.call('SET', base .. 'full', '1')
    redis.call('ZREM', base .. 'wake', WAKE_NOW)  -- a job leaving active wakes a worker again
    return '{"full":1}'
  end
  count = math.min(count, free)
end
local limit, per, sliding = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8] == 'sliding'
local limiter, start, used = base .. 'limiter', 0, 0
local log = base .. 'limiter:log'
if limit > 0 and sliding then
  -- a log of start times: what started more than `per` ago no longer counts.
  -- Its time only moves forward: a claim whose host read its clock before
  -- another's ran after it starts at the log's newest time, or its trim
  -- would drop starts that still count for that time (and so would a host
  -- whose clock is behind)
  local newest = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')[2]
  if newest and tonumber(newest) > tonumber(now) then
    now = newest
  end
  redis.call('ZREMRANGEBYSCORE', log, '-inf', tonumber(now) - per)
  used = redis.call('ZCARD', log)
  if used >= limit then
    if not claimable() then
      return '[]'
    end
    -- refused claims take turns over the starts that will leave the window
    -- (the 1st waits for the oldest, the 2nd for the next...), so the idle
    -- workers do not all wake at once for the one start that frees; a
    -- claim that starts jobs resets the turns, so a lone worker always
    -- waits for the oldest
    local turn = redis.call('INCR', base .. 'limiter:log:turn')
    redis.call('PEXPIRE', base .. 'limiter:log:turn', per)
    local k = (turn - 1) % used
    local leaves = redis.call('ZRANGE', log, k, k, 'WITHSCORES')[2]
    return cjson.encode({wait = math.max(1, tonumber(leaves) + per - tonumber(now))})
  end
  count = math.min(count, limit - used)
elseif limit > 0 then
  -- a fixed window in one hash {start, n} that never grows
  local w = redis.call('HMGET', limiter, 'start', 'n')
  start, used = tonumber(w[1] or '0'), tonumber(w[2] or '0')
  if tonumber(now) >= start + per then
    start, used = tonumber(now), 0
  end
  if used >= limit then
    if not claimable() then
      return '[]'  -- nothing to wait for: a burst worker ends, an idle one rests until woken
    end
    return cjson.encode({wait = start + per - tonumber(now)})
  end
  count = math.min(count, limit - used)
end
local prioritized = base .. 'prioritized'
-- pop up to n ids in claim order; false when there are none
local function pop(n)
  local sorted = {prioritized, base .. 'groups', base .. 'groups:limited'}
  local found = redis.call('EXISTS', base .. 'pending:ranged', unpack(sorted))
  if found == 0 then
    return redis.call('LPOP', pending, n)  -- the plain path: one command
  end
  local sorted_found = redis.call('EXISTS', unpack(sorted))
  local ranged = found > sorted_found  -- the list holds ranges (lib/pending.lua)
  if sorted_found == 0 then
    return pending_pop(base, n, ranged)
  end
  local ids = redis.call('ZRANGE', prioritized, '-inf', '(0', 'BYSCORE', 'LIMIT', 0, n)
  if #ids > 0 then
    redis.call('ZREM', prioritized, unpack(ids))
  end
  if #ids < n then
    for _, id in ipairs(pending_pop(base, n - #ids, ranged) or {}) do
      ids[#ids + 1] = id
    end
  end
  if #ids < n then
    local low = redis.call('ZPOPMIN', prioritized, n - #ids)
    for i = 1, #low, 2 do
      ids[#ids + 1] = low[i]
    end
  end
  if #ids < n then  -- the groups in turn (lib/groups.lua)
    for _, id in ipairs(pop_groups(base, n - #ids, ARGV[11], ARGV[12], tonumber(now))) do
      ids[#ids + 1] = id
    end
  end
  return #ids > 0 and ids
end

-- A pending job's fields, in READ's order (`false` for an absent one). Most
-- rows hold only what a leaf or a plain job is written with: COMMON's
-- fields, and a job of enqueue() its replay token. One HMGET and one HLEN
-- tell such a row (all it holds is among them: every other field is
-- absent, and no walk of the row's listpack looks for each); a row holding
-- one field more asks whether that is the token (HEXISTS), which costs a
-- flow's leaf nothing; a row added as pending holds no state, and is
-- pending. Any other row is read whole (lib/row.lua row_read).
-- docs/explanation/performance.md#fields-a-row-does-not-hold
local READ = {F_STATE, F_NAME, F_DATA, 'attempts', 'max_attempts', 'backoff_ms', F_PARENT,
  F_PQUEUE, F_POLICY, F_CREATED, 'timeout_ms', 'priority', 'traceparent', 'retry_policy',
  'expires_at', 'started_at', F_PINC, 'name'}
local COMMON = {F_STATE, F_NAME, F_DATA, 'attempts', F_PARENT, F_PQUEUE, F_CREATED, F_PINC}
local function claim_read(row)
  local got = redis.call('HMGET', row, unpack(COMMON))
  local held = 0
  for i = 1, #COMMON do
    if got[i] then
      held = held + 1
    end
  end
  local extra = held > 0 and redis.call('HLEN', row) - held
  if extra == 0 or (extra == 1 and redis.call('HEXISTS', row, 'enqueue_token') == 1) then
    -- a row of this version: no state is pending (lib/row.lua pending_if_there)
    return {got[1] or 'pending', got[2], got[3], got[4], false, false, got[5], got[6], false,
      created_of(got[7], got[8]), false, false, false, false, false, false}
  end
  local f = row_read(row, READ)
  f[10] = created_of(f[10], f[17])
  return f
end

local batch = nil  -- the lease sequence, drawn at the first lease (none: nothing written)
local out, leases, expired, popped = {}, {}, 0, 0
local gone = {}  -- id, name of each job killed here as expired (the host logs them)
local want, full = count, false
while want > 0 do
  local ids = pop(want)
  full = ids and #ids == want
  local died = 0
  for _, id in ipairs(ids or {}) do
    popped = popped + 1
    local row = base .. 'job:' .. id
    -- one read and one write per job: this loop is the hot path of a worker
    local f = claim_read(row)
    if f[7] then  -- the whole id and its queue (lib/row.lua row_hmget_p)
      local pid, q = parent_of(id, f[7])
      f[7], f[8] = pid, q or f[8]
    end
    if f[1] == 'pending' and f[15] and not f[16] and tonumber(f[15]) <= tonumber(now) then
      -- popped already: marked active so kill takes it out of no list (an
      -- LREM would scan the pending list); it never started, attempts stay
      redis.call('HSET', row, F_STATE, 'active')
      kill(base, id, 'expired', tonumber(now))
      gone[#gone + 1], gone[#gone + 2] = id, f[2] or ''
      died = died + 1
    elseif f[1] == 'pending' then
      batch = batch or (redis.call('INCR', KEYS[3]) .. '.')
      local token = batch .. popped
      local attempts = f[4] and tostring((tonumber(f[4]) or 0) + 1) or '1'
      if attempts ~= '1' and f[16] then
        -- a later attempt: its first start stays as `first_started_at` (HSETNX
        -- keeps the earliest); a first attempt writes nothing more
        -- (docs/explanation/protocol.md#the-errors-of-earlier-attempts)
        redis.call('HSETNX', row, 'first_started_at', f[16])
      end
      redis.call('HSET', row, F_STATE, 'active', 'lease', token, 'started_at', now,
        'attempts', attempts)
      leases[#leases + 1] = deadline
      leases[#leases + 1] = id
      local o = #leases / 2 * 15 - 15  -- this job's place in `out` (15 values a job)
      out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = id, token, f[2], f[3], attempts
      for j = 5, 14 do
        out[o + j + 1] = f[j]
      end
    end
  end
  expired = expired + died
  -- an expired job's place goes to the next one, within the budget; its
  -- death may have made jobs claimable (a parent it released, its on_dead
  -- job): pop again even when this pop drained the queue
  want = (died > 0 and expired < EXPIRED_BUDGET)
    and math.min(count - #leases / 2, EXPIRED_BUDGET - expired) or 0
end
if not ((full or expired > 0) and claimable()) then
  redis.call('ZREM', base .. 'wake', WAKE_NOW)  -- drained: nothing left to wake for
elseif free >= 0 and #leases / 2 >= free then
  -- more is waiting but the cap is reached: the next job to leave active
  -- wakes a worker (lib/claimable.lua left_active)
  redis.call('ZREM', base .. 'wake', WAKE_NOW)
  redis.call('SET', base .. 'full', '1')
else
  wake_workers(base)  -- more is waiting (room under the cap): the next idle worker claims it
end
if #leases == 0 then  -- cjson would encode an empty table as {}
  return #gone > 0 and ('{"jobs":[],"expired":' .. cjson.encode(gone) .. '}') or '[]'
end
redis.call('ZADD', active, unpack(leases))
local claimed = {}
for i = 2, #leases, 2 do
  claimed[#claimed + 1] = leases[i]
end
emit_to(base .. 'events', 'active', run_text(claimed))
if limit > 0 and sliding then
  local starts = {}
  for i = 1, #leases, 2 do
    starts[#starts + 1] = now
    starts[#starts + 1] = out[(i - 1) / 2 * 15 + 2]  -- the lease token: unique per start
  end
  redis.call('ZADD', log, unpack(starts))
  redis.call('PEXPIRE', log, per)
  redis.call('DEL', base .. 'limiter:log:turn')  -- the turns start again from the oldest
elseif limit > 0 then
  redis.call('HSET', limiter, 'start', start, 'n', used + #leases / 2)
end
local reply = cjson.encode(out)
redis.call('SET', memo, reply, 'PX', ARGV[4])
if #gone > 0 then
  return '{"jobs":' .. reply .. ',"expired":' .. cjson.encode(gone) .. '}'
end
return reply
