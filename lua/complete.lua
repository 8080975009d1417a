--[[
  complete: active -> completed, store the result, fan in to the parent; for
  one job or a batch of jobs of this queue. Each job is its own transition,
  checked and applied in turn exactly as if alone (a refused job writes
  nothing and does not stop the others); a batch saves the round trips and
  the per-call cost of one script per job. docs/explanation/protocol.md#complete,
  docs/explanation/protocol.md#guarantees. A same-queue parent is resolved here (HSETNX :processed,
  DECR, release at zero); a cross-queue parent gets a completion entry
  RPUSHed onto this queue's outbox in the same step, or on one server is
  resolved here too (ARGV[4]). A job with an on_success
  callback adds its callback job here (lib/flow.lua callback).

  KEYS[1] active zset          P:{q}:active
  KEYS[2] completed zset       P:{q}:completed (score: finished-at, ms)

  ARGV[1] queue name
  ARGV[2] queue key prefix     P:{q}: (job rows are P:{q}:job:<id>, same slot)
  ARGV[3] now (ms)
  ARGV[4] '1' when the client runs on one server (no Cluster): a cross-queue
          parent's `done` is then applied here when this queue's outbox is
          empty (lib/flow.lua fan_in_here,
          docs/explanation/protocol.md#fan-in-on-one-server); '0' otherwise
  ARGV[5] the progress and log writes the batch's jobs left pending: '' for
          none (the plain path: one string compare), or one JSON array, the
          lines kept (KEEP_LOGS) and then write_reports.lua's ARGV[4] for
          those jobs; written first, exactly as a write_reports call ahead
          of this one in the same round trip would (lib/reports.lua: each
          checked under its lease, one events entry for their progress
          values, ahead of every completion's), so a job's progress and
          lines are final when it is (docs/howto/progress-and-logs.md#when-a-write-is-visible);
          a job completed here has its row read once for both (the
          lease check reuses the completion's read) and its last
          progress value and its job log's new oldest line (`lg`) go into
          its completion's own HSET
  ARGV[6]  the jobs, 3 values each, joined by the byte 0x1F (ASCII's unit
           separator, in neither an id, a lease token nor JSON text: an id
           holds no whitespace, and JSON escapes control characters): job id,
           lease token (from claim, '' for none), result (a JSON text). One
           argument, not 3 per job: redis-py packs each argument in Python,
           about 1 µs apiece (docs/explanation/performance.md#a-busy-workers-own-costs)

  returns: a JSON array with one entry per job, in order:
           0 when the job completed and moved nothing else;
           {released: [P:{q}:id...], dead, flow_failed, revived, outbox: n,
           sent?: [entry...]} when it completed and also released or failed
           a parent, revived one, or pushed an outbox entry (`sent`: the
           entries for another slot it pushed onto this queue's outbox,
           exactly as pushed: a worker holding the sweep lock delivers them
           itself, docs/explanation/no-polling.md#a-released-parent-starts-at-once);
           an error string when the job was refused (nothing written for it):
             EMQNOJOB <queue> <id>            no such job
             EMQSTATE <queue> <id> <state>    the job is not active
             EMQLEASE <queue> <id>            the lease token is stale
             EMQCANCELLED <queue> <id>        the job was cancelled while it
                                              ran: the result is dropped and
                                              the job is dead ('cancelled')
           or, for a cancelled job whose death pushed outbox entries,
           {error: 'EMQCANCELLED <queue> <id>', sent: [entry...]} (`sent` as
           above: its worker delivers its death as it does a completion)
           A completed row keeps its last lease token, so a replay of the
           same call (redis-py re-sends a command whose reply was lost: same
           token, same result) answers 0 instead of EMQSTATE. A job whose
           flow was removed while it ran (`orphaned`) is removed as it
           completes (job_completed is still sent); its lease token and
           result stay as P:{q}:op:<lease> for 10 minutes, so a replay
           answers 0 instead of EMQNOJOB.
  errors:  none: a refusal is its job's entry in the reply
]]
local active, completed = KEYS[1], KEYS[2]
local QUEUE = ARGV[1]
-- @include lib/flow.lua
-- @include lib/reports.lua
minute_batch = {}  -- the batch's counts, written once each (lib/emit.lua)
local base, now = ARGV[2], tonumber(ARGV[3])
ONE_SERVER = ARGV[4] == '1'

-- a completing job's fields (lib/row.lua row_read), the parent as its whole id
local READ = {F_STATE, 'lease', F_PARENT, F_PQUEUE, 'dedup', 'keep', 'cancel', F_PINC,
  'orphaned', 'callbacks', 'group', 'lg', 'name'}
local function read_row(row, id)
  local f = row_read(row, READ)
  if f[3] then  -- the whole id and its queue (lib/row.lua row_hmget_p)
    local pid, q = parent_of(id, f[3])
    f[3], f[4] = pid, q or f[4]
  end
  return f
end

-- ARGV[6] split: J[i], J[i + 1], J[i + 2] are a job's id, lease token and result
local J = split_joined(ARGV[6])  -- lib/lease.lua, through lib/reports.lua

-- the rows the writes read (a completing job's: its completion reuses the
-- read), and the progress values and oldest log lines they left for the
-- completion's own HSET
local fetched, progress_of, lg_of = {}, {}, {}
if ARGV[5] ~= '' then  -- a refused write is refused again by its job's completion below
  local completing = {}
  for i = 1, #J, 3 do
    completing[J[i]] = true
  end
  local writes = cjson.decode(ARGV[5])
  write_reports(base .. 'events', QUEUE, base, writes[1], writes, 2, {
    progress = progress_of, lg = lg_of, lg_at = 12,  -- read_row's 'lg'
    read = function(id, row)
      if completing[id] then
        fetched[id] = fetched[id] or read_row(row, id)
        return fetched[id]
      end
    end})
end

local replies = {}
-- the completed jobs' ids leave active, and enter completed, in one ZREM and
-- one ZADD for the batch: nothing in this call reads either set
local gone, done_at = {}, {}
FAN_KEPT = {}  -- lib/flow.lua fan_in_done: a parent's read kept for its next children here
-- set once a completion here may have written another job's row (its parent,
-- callbacks, group, cancel or removed flow): each later row is read again
local moved = false
-- what one job moved goes in OUT's tables (the helpers append to them): new
-- tables only once a job's reply took the last ones; a job that moved
-- nothing (a wide flow's leaf) leaves them empty for the next
local out_taken = true
local function reset_out()
  if out_taken then
    OUT.released, OUT.dead, OUT.flow_failed, OUT.revived, OUT.sent = {}, {}, {}, {}, {}
    out_taken = false
  end
  OUT.outbox = 0
end
local rows, events, done_prefix = base .. 'job:', base .. 'events', base .. 'done:'
for i = 1, #J, 3 do
  local id, token, result = J[i], J[i + 1], J[i + 2]
  local row = rows .. id
  local f = (not moved and fetched[id]) or read_row(row, id)
  fetched[id] = nil  -- the same id again in the batch reads its row again
  if f[3] or f[10] or f[11] or f[7] or f[9] then
    moved = true
  end
  -- its carried writes' row fields, not written yet: the last progress
  -- value, the job log's new oldest line
  local progress, lg = progress_of[id], lg_of[id]
  if progress or lg then
    progress_of[id], lg_of[id] = nil, nil
    if f[1] and not (f[1] == 'active' and f[2] == token and not f[7] and not f[9]) then
      -- not the plain completion: alone (with one of the two, its field
      -- twice: HSET takes the same value again)
      redis.call('HSET', row, progress and 'progress' or 'lg', progress or lg,
        lg and 'lg' or 'progress', lg or progress)
      progress, lg = nil, nil
    end
  end
  if not f[1] then
    -- a replay of the call that completed a removed flow's job (drop_orphan)
    if redis.call('GET', base .. 'op:' .. token) == 'c' .. redis.sha1hex(result) then
      replies[#replies + 1] = 0
    else
      replies[#replies + 1] = 'EMQNOJOB ' .. QUEUE .. ' ' .. id
    end
  elseif f[1] == 'completed' and f[2] == token and redis.call('HGET', row, 'result') == result then
    replies[#replies + 1] = 0  -- a replay: this lease completed it already, with this result
  elseif f[1] ~= 'active' then
    replies[#replies + 1] = 'EMQSTATE ' .. QUEUE .. ' ' .. id .. ' ' .. f[1]
  elseif f[2] ~= token then
    replies[#replies + 1] = 'EMQLEASE ' .. QUEUE .. ' ' .. id
  elseif f[7] then
    -- cancelled while it ran (docs/explanation/lifecycle.md): the result is dropped, the job dies
    -- (what its death moved goes in tables of its own: an earlier job's reply
    -- holds the last ones, and a refusal reports none)
    reset_out()
    out_taken = true
    kill(base, id, 'cancelled', now)
    FAN_KEPT = {}  -- its death may have written its parent: read them again
    local refused = 'EMQCANCELLED ' .. QUEUE .. ' ' .. id
    replies[#replies + 1] = (#OUT.sent > 0) and {error = refused, sent = OUT.sent} or refused
  else
    -- what this job moves, on its own (the helpers append to OUT; OUT.sent:
    -- lib/flow.lua send()'s entries as pushed, for a worker that delivers them)
    reset_out()
    gone[#gone + 1] = id  -- out of active with the batch's others, below
    left_active(base, f[11] or nil)
    callback(base, id, f[10], 's', result, nil, now)  -- its on_success job
    if f[9] then
      -- its flow was removed while it ran: job_completed is still sent (the
      -- handler ran, its effects are real), then the row goes at once
      -- (docs/explanation/lifecycle.md#a-removed-flows-running-nodes)
      emit(base, 'completed', id)
      signal_event(base, 'completed', id, result)
      free_dedup(base, f[5], id)
      drop_orphan(base, id, row, token, 'c' .. redis.sha1hex(result))
    else
      if progress or lg then  -- its carried fields, in the same HSET (as above)
        redis.call('HSET', row, F_STATE, 'completed', 'result', result, 'finished_at', ARGV[3],
          progress and 'progress' or 'lg', progress or lg, lg and 'lg' or 'progress',
          lg or progress)
      else
        redis.call('HSET', row, F_STATE, 'completed', 'result', result, 'finished_at', ARGV[3])
      end
      done_at[#done_at + 1] = ARGV[3]  -- into completed with the batch's others, below (text:
      -- a number argument is formatted again for each job)
      done_at[#done_at + 1] = id
      if f[6] then  -- its own keep (ms): retention's expire list (lib/lifecycle.lua)
        redis.call('ZADD', base .. 'expire', now + tonumber(f[6]), id)
      end
      -- one `completed` entry for a run of the batch's jobs (lib/emit.lua emit_later)
      emit_later(events, 'completed', id)
      note_done_later(done_prefix .. id)  -- with the batch's others, below (lib/emit.lua)
      signal_event(base, 'completed', id, result)
      free_dedup(base, f[5], id)
      resolve_done(base, id, result, now, f[3], f[4], f[8], row)
    end
    if f[9] or f[10] then  -- a removed flow's node or a callback: read parents again
      FAN_KEPT = {}
    end
    if #OUT.released + #OUT.dead + #OUT.flow_failed + #OUT.revived + OUT.outbox > 0 then
      FAN_KEPT = {}
      out_taken = true
      replies[#replies + 1] = {released = OUT.released, dead = OUT.dead,
        flow_failed = OUT.flow_failed, revived = OUT.revived, outbox = OUT.outbox,
        sent = (#OUT.sent > 0) and OUT.sent or nil}
    else
      replies[#replies + 1] = 0
    end
  end
end
if #gone > 0 then
  redis.call('ZREM', active, unpack(gone))
end
if #done_at > 0 then
  redis.call('ZADD', completed, unpack(done_at))
end
flush_later()
flush_minutes()
flush_done('completed')
return cjson.encode(replies)
