--[[
  lib/flow.lua: shared helpers, inlined by the script loader into every script whose
  header says `@include lib/flow.lua`. Not a script of its own: it defines
  local functions only and touches no key until a script calls them.

  Why a shared file: fan-in and death propagation (docs/explanation/protocol.md#flows) are the same
  whether a child finishes in `complete`, dies in `fail` / `recover_stalled`,
  or is delivered from another slot by the pump (`deliver_to_parents`). One copy
  keeps the exactly-once guard identical on every road.

  A child row without `pq` (its parent queue) has its parent on this queue,
  and one without `pp` (its policy) has policy 'fp' (compact rows,
  enqueue_flow; the short names are lib/row.lua's).

  Incarnations (docs/explanation/protocol.md#incarnations): a parent holds `inc`, a token drawn when
  its flow was added, and each child holds its parent's as `pi`
  (enqueue_flow; a child taken back by a flow added again gets the new
  one). Ids, and so child refs, are the same in every flow added under
  them: the token tells a child of this parent from one of a removed parent
  of the same id that is still in flight (an outbox entry, a child not yet
  reached by its parent's removal, a running one). Every fan-in here and
  every entry (`i`) carries it; a parent whose `inc` is another changes
  nothing (counted in OUT.stale). A row or entry without one (written
  before incarnations) is taken as it comes. A child whose parent was
  removed while it ran is also marked `orphaned` (lib/lifecycle.lua) and
  resolves no parent, unless a flow added again takes it back.

  Every key these helpers build is `base .. suffix` where `base` is the
  `P:{q}:` of the queue the script runs on: one slot (docs/explanation/protocol.md#one-slot-per-script). A
  parent on another slot is never touched: an outbox entry is pushed instead,
  except by complete.lua on one server (fan_in_here).

  The including script defines `QUEUE` (its queue name) before the include.
  A job becomes claimable, and an entry lands on the outbox, only through
  lib/claimable.lua (included here), which also wakes the workers / pump.

  Results are collected in OUT: released, dead, flow_failed and revived hold
  `P:{q}:<id>` strings (queue key prefix + id), reattach the outbox entries a
  retry emitted, outbox the number of entries pushed. The calling script
  returns cjson.encode(OUT).
]]
-- @include lib/row.lua
-- @include lib/signal_events.lua
-- @include lib/emit.lua
-- @include lib/error.lua
-- @include lib/cancel_out.lua

-- @include lib/claimable.lua

-- Set by complete.lua when the client runs on one server, not a Cluster
-- (fan_in_here).
local ONE_SERVER = false

local OUT = {released = {}, dead = {}, flow_failed = {}, revived = {}, reattach = {}, outbox = 0,
  stale = 0}
-- A finished job (completed, dead, cancelled) also tells its waiters: one
-- entry on P:{q}:done:<id> if a waiter made that stream (EXISTS only when
-- nobody waits); the waiter set its expiry (docs/explanation/protocol.md#waiting-for-a-result).
local FINISHED = {completed = true, dead = true, cancelled = true}
local function emit(base, event, id)
  emit_to(base .. 'events', event, id)
  if FINISHED[event] then
    note_done(base .. 'done:' .. id, event)
  end
end

local function job_key(base, id)
  return base .. 'job:' .. id
end

-- The parent row's state, or nil when the row is gone (then false) or is
-- another incarnation than `inc` (then true: counted in OUT.stale). `inc`
-- nil or false: any incarnation.
local function parent_state(pkey, inc)
  local f = row_hmget_s(pkey, F_STATE, 'inc')
  if not f[1] then
    return nil, false
  end
  if inc and f[2] and f[2] ~= inc then
    OUT.stale = OUT.stale + 1
    return nil, true
  end
  return f[1]
end

-- The child ref is the child's full job key: unique across queues (docs/explanation/protocol.md#the-job-row).
local function child_ref(base, id)
  return base .. 'job:' .. id
end

-- True when the child has already resolved its parent by a decrement
-- (completed, ignored or removed). A child in :failed has not: `fp` keeps it
-- counted so that a retry can re-attach it (docs/explanation/protocol.md#retry).
local function already_resolved(pkey, ref)
  return redis.call('HEXISTS', pkey .. ':processed', ref) == 1
      or redis.call('HEXISTS', pkey .. ':unsuccessful', ref) == 1
      or redis.call('HEXISTS', pkey .. ':removed', ref) == 1
end

-- A key freed when its job finishes (dedup_key, docs/explanation/protocol.md#scheduling): only while it
-- still names this job (after a ttl it may name a newer one).
local function free_dedup(base, key, id)
  if key and redis.call('GET', base .. 'dedup:' .. key) == id then
    redis.call('DEL', base .. 'dedup:' .. key)
  end
end

-- Release a held parent (awaiting_children -> pending) once; a parent with a
-- `delay_until` still in the future goes to delayed instead (a delayed parent
-- waits for its children and its delay, docs/explanation/protocol.md#scheduling). A dead parent is never
-- released.
local function release(base, pid, now)
  local pkey = job_key(base, pid)
  local f = row_hmget_s(pkey, F_STATE, 'delay_until', 'children_deadline', 'priority',
    'group')
  if f[1] ~= 'awaiting_children' then
    return
  end
  redis.call('ZREM', base .. 'awaiting', pid)
  if f[3] then
    redis.call('ZREM', base .. 'deadlines', pid)
  end
  local at = tonumber(f[2] or '0')
  if at > now then
    redis.call('HSET', pkey, F_STATE, 'delayed', 'updated_at', now)
    make_delayed(base, pid, at)
  else
    redis.call('HSET', pkey, F_STATE, 'pending', 'updated_at', now)
    make_claimable(base, {pid}, f[4], true, f[5] or nil)  -- the front of its priority
  end
  emit(base, 'released', pid)
  signal_event(base, 'released', pid)
  OUT.released[#OUT.released + 1] = base .. pid
end

-- Decrement the parent's counter (never below zero) and release it when it
-- reaches zero while still awaiting_children: a dead parent is never released.
local function decrement_and_maybe_release(base, pid, now)
  local pkey = job_key(base, pid)
  local left = tonumber(redis.call('GET', pkey .. ':dependencies') or '0')
  if left > 0 then
    left = redis.call('DECR', pkey .. ':dependencies')
  end
  if left <= 0 then
    release(base, pid, now)
  end
  return left
end

-- A cancelled job taken back (a retry of it, or its revival when its last
-- failed child is retried: docs/explanation/lifecycle.md#a-retry-takes-a-cancel-back): its queued subtree work (its P:{q}:cancel item, its `cancel`
-- entries still in this queue's outbox) goes, and its same-slot children
-- still running lose their `cancel` mark, so their results count.
local function uncancel(base, jid, key)
  local list = base .. 'cancel'
  for _, item in ipairs(redis.call('LRANGE', list, 0, -1)) do
    if item:sub(1, #jid + 1) == jid .. ' ' then
      redis.call('LREM', list, 0, item)
    end
  end
  local outbox = base .. 'flow:outbox'
  local out = tonumber(redis.call('HGET', key, 'cancel_out') or '0')  -- lib/cancel_out.lua
  if out > 0 then  -- some still there: searched until that many went
    for _, raw in ipairs(redis.call('LRANGE', outbox, 0, -1)) do
      if cancel_parent(raw) == jid then
        redis.call('LREM', outbox, 1, raw)
        out = out - 1
        if out == 0 then
          break
        end
      end
    end
    redis.call('HDEL', key, 'cancel_out')
  end
  local mine = base .. 'job:'
  local inc = redis.call('HGET', key, 'inc')
  for _, ckey in ipairs(child_keys(base, jid, redis.call('LRANGE', key .. ':children', 0, -1))) do
    if ckey:sub(1, #mine) == mine then
      local c = row_hmget_p(ckey, F_STATE, F_PARENT, 'cancel', F_PINC)
      if c[1] == 'active' and c[2] == jid and c[3] and c[4] == inc then
        redis.call('HDEL', ckey, 'cancel')
      end
    end
  end
end

local reattach

-- A child its parent ignored (`id`) re-attaches when it is retried
-- (docs/explanation/reliability.md#a-retried-child-its-parent-ignored): while the parent has not been released (it waits, or is dead and
-- may be retried itself) the child leaves :unsuccessful and the counter
-- counts it again, so its next completion or death resolves the parent once
-- more, exactly like a first one. A parent that went on without it keeps the
-- child in :unsuccessful (the retry script refuses that case up front when it
-- can see the parent; across slots the host checks first).
local function reattach_ignored(base, pid, ref, inc)
  local pkey = job_key(base, pid)
  local pstate = parent_state(pkey, inc)
  if pstate ~= 'awaiting_children' and pstate ~= 'dead' then
    return
  end
  if redis.call('HDEL', pkey .. ':unsuccessful', ref) == 1 then
    redis.call('INCR', pkey .. ':dependencies')
  end
end

-- A job that left dead (retried, or revived) re-attaches to a parent it had
-- failed (`fp`) or that ignored it (`id`, above): here when the parent shares
-- the slot, else by a `reattach` entry on this queue's outbox that the pump
-- delivers (docs/explanation/protocol.md#retry).
local function reattach_up(base, id, now)
  local parent = row_hmget_p(job_key(base, id), F_PARENT, F_PQUEUE, F_POLICY,
    F_PINC, 'orphaned')
  local policy = parent[3] or 'fp'
  if not parent[1] or parent[5] or (policy ~= 'fp' and policy ~= 'id') then
    return
  end
  local ref = child_ref(base, id)
  if (parent[2] or QUEUE) == QUEUE then
    if policy == 'id' then
      reattach_ignored(base, parent[1], ref, parent[4])
    else
      reattach(base, parent[1], ref, now, parent[4])
    end
  else
    -- its death still waits in this queue's outbox: take it back, the parent
    -- never saw it (a pump that already read it delivers it, and the child's
    -- next completion re-attaches it: fan_in_done)
    -- (read from the head, 200 at a time: a death still there is older than
    -- what the pumps fell behind on since; decoded only when it names this
    -- child, so a poison entry costs a plain find)
    local outbox = base .. 'flow:outbox'
    local at = 0
    repeat
      local chunk = redis.call('LRANGE', outbox, at, at + 199)
      for _, raw in ipairs(chunk) do
        if raw:find(ref, 1, true) then
          local ok, e = pcall(cjson.decode, raw)
          if ok and type(e) == 'table' and e.k == 'dead' and e.c == ref and e.p == parent[1]
              and e.i == (parent[4] or nil) then
            redis.call('LREM', outbox, 1, raw)
            return
          end
        end
      end
      at = at + 200
    until #chunk < 200
    local entry = cjson.encode({k = 'reattach', c = ref, p = parent[1], q = parent[2],
      pol = (policy == 'id') and 'id' or nil, i = parent[4] or nil})
    push_outbox(base, entry)
    OUT.outbox = OUT.outbox + 1
    OUT.reattach[#OUT.reattach + 1] = entry
  end
end

-- Take a child out of its parent's :failed; when that was the last failed
-- child of a dead parent, the parent returns to awaiting_children (its counter
-- still counts the child) and re-attaches one level up in turn. `inc`, when
-- given, must be the parent's incarnation (checked by the caller otherwise).
reattach = function(base, pid, ref, now, inc)
  local pkey = job_key(base, pid)
  if inc and not parent_state(pkey, inc) then
    return
  end
  if redis.call('HDEL', pkey .. ':failed', ref) == 0 then
    return
  end
  if redis.call('HLEN', pkey .. ':failed') > 0 or row_hmget_s(pkey, F_STATE)[1] ~= 'dead' then
    return
  end
  redis.call('ZREM', base .. 'dead', pid)
  redis.call('ZADD', base .. 'awaiting', now, pid)
  redis.call('HSET', pkey, F_STATE, 'awaiting_children', 'updated_at', now)
  redis.call('HDEL', pkey, 'finished_at')
  if redis.call('HGET', pkey, 'error') == 'cancelled' then
    uncancel(base, pid, pkey)  -- revived: its cancel is taken back, as by its own retry
  end
  clear_error(pkey)
  emit(base, 'reattached', pid)
  OUT.revived[#OUT.revived + 1] = base .. pid
  reattach_up(base, pid, now)
end

local propagate_death

-- A child finished: record its result with HSETNX (the exactly-once guard) and
-- decrement only on a new entry. A child sitting in :failed (an `fp` death
-- later retried) leaves :failed as it resolves: the retry re-attached it.
-- Returns false when the parent row is gone, true otherwise (a parent of
-- another incarnation than `inc` is left as it is).
-- What fan_in_done learnt of a parent, kept for the next of its children in
-- the same call: FAN_KEPT[parent key] = the incarnation it was read for (''
-- for any), set only while the parent waits on more children, holds no child
-- outside :processed, and nothing else in the call wrote it. A script that
-- keeps it (complete.lua: a batch of one queue's completions, many of one
-- parent) sets FAN_KEPT = {} and empties it after any completion that did
-- more than fan in; every other script leaves it nil and reads each time.
-- A kept parent's next child costs HSETNX and DECR: the state read, the
-- EXISTS of the three hashes and the GET before the DECR are known.
local FAN_KEPT = nil
local FAN_KEYS = {}  -- a kept parent's :processed and :dependencies keys, made once a call

local function fan_in_done(base, pid, ref, result, now, inc)
  local pkey = job_key(base, pid)
  if FAN_KEPT and FAN_KEPT[pkey] == (inc or '') then
    local keys = FAN_KEYS[pkey]
    if not keys then
      keys = {pkey .. ':processed', pkey .. ':dependencies'}
      FAN_KEYS[pkey] = keys
    end
    if redis.call('HSETNX', keys[1], ref, result) == 1 then
      -- its dependencies were above 0 after the last DECR, so this one is safe
      if redis.call('DECR', keys[2]) <= 0 then
        FAN_KEPT[pkey] = nil
        release(base, pid, now)
      end
    end
    return true
  end
  local state, stale = parent_state(pkey, inc)
  if not state then
    return stale
  end
  -- the hashes a child may sit in other than :processed: none exists while
  -- every child so far completed (a wide flow's common case), and one EXISTS
  -- then stands for the two HEXISTS and reattach's HDEL
  if redis.call('EXISTS', pkey .. ':unsuccessful', pkey .. ':removed', pkey .. ':failed') > 0 then
    if redis.call('HEXISTS', pkey .. ':unsuccessful', ref) == 1
        or redis.call('HEXISTS', pkey .. ':removed', ref) == 1 then
      return true
    end
    reattach(base, pid, ref, now)
  elseif FAN_KEPT and state == 'awaiting_children' then
    if redis.call('HSETNX', pkey .. ':processed', ref, result) == 1
        and decrement_and_maybe_release(base, pid, now) > 0 then
      FAN_KEPT[pkey] = inc or ''
    end
    return true
  end
  if redis.call('HSETNX', pkey .. ':processed', ref, result) == 1 then
    decrement_and_maybe_release(base, pid, now)
  end
  return true
end

-- A parent's keys: its child refs move to the gc list (their rows go in
-- later steps), its row, hashes, job log and earlier errors go.
local function drop_parent_keys(base, id)
  local key = base .. 'job:' .. id
  local inc = redis.call('HGET', key, 'inc')
  local bin = base .. 'gc:' .. redis.call('INCR', base .. 'gc:seq') .. (inc and ('-' .. inc) or '')
    .. ':' .. id
  redis.call('RENAME', key .. ':children', bin)
  redis.call('RPUSH', base .. 'gc', bin)
  redis.call('UNLINK', key, key .. ':dependencies', key .. ':processed', key .. ':failed',
    key .. ':unsuccessful', key .. ':removed', key .. ':logs', key .. ':errors')
end

-- A job whose flow was removed while it ran (`orphaned`, set when the
-- removal reached it: lib/lifecycle.lua drop_node, on its own slot, by the
-- removal itself or by its `rm` entry) goes as soon as it finishes
-- (docs/explanation/lifecycle.md#a-removed-flows-running-nodes): the caller
-- has written its finishing event and signals; the row goes now, with a
-- `removed` event, and its own children (a node that went on without some)
-- through the gc list, at the next prune. Its last lease leaves a replay mark
-- (`op:<lease>` = `tomb`, 10 minutes), so that a replay of the complete or
-- fail that finished it answers as the first call did (no row is left to
-- recognise it by).
local function drop_orphan(base, id, key, lease, tomb)
  if lease then
    redis.call('SET', base .. 'op:' .. lease, tomb, 'PX', 600000)
  end
  if redis.call('EXISTS', key .. ':children') == 1 then
    drop_parent_keys(base, id)
  else
    redis.call('UNLINK', key, key .. ':logs', key .. ':errors')
  end
  emit(base, 'removed', id)
end

-- Callbacks (docs/howto/retries.md#callbacks): a row's `callbacks` field
-- (`spec`: JSON {s, f, d}, the handler names for success, a failed attempt
-- that is retried, and death) makes that outcome add a job of its own on this
-- queue, in the script that finishes the job (durable, never in the worker's
-- thread). Its id is 'cb-' and a sha1 of the job key, its add time (one
-- life of the id: a job removed and added again starts its count anew), the
-- kind and a count kept on the row (`callbacks_n`); a row of that id found
-- there already is left as it is. Its payload {"job": "<queue>/<id>",
-- "result": <result>} (the result's JSON text) or {..., "error": <err>}
-- (`err` a string, made JSON here: nothing is made for a job without a
-- callback).
-- A callback named as [queue, name] on another queue goes through this
-- queue's outbox instead (a `cb` entry, written in the same step: durable,
-- delivered at least once by the pump's deliver_to_parents, which writes the
-- job on its own slot unless a row of that id is there already).
-- An entry for another slot on this queue's outbox, counted; a lifecycle step
-- (lib/lifecycle.lua: OUT.sent) delivers it at once itself, and so does the
-- worker of a complete (complete.lua: OUT.sent) that holds the sweep lock.
local function send(base, entry)
  push_outbox(base, entry)
  OUT.outbox = OUT.outbox + 1
  if OUT.sent then
    OUT.sent[#OUT.sent + 1] = entry
  end
end

local function callback(base, id, spec, kind, result, err, now)
  local name = spec and cjson.decode(spec)[kind]
  if not name then
    return
  end
  local body = result and ('"result":' .. result) or ('"error":' .. cjson.encode(err))
  local key = job_key(base, id)
  local n = redis.call('HINCRBY', key, 'callbacks_n', 1)
  local t = redis.call('HMGET', key, F_CREATED, LONG_NAME[F_CREATED], F_PINC)
  local life = created_of(t[1] or t[2], t[3]) or ''
  local cid = 'cb-' .. redis.sha1hex(key .. '|' .. life .. '|' .. kind .. '|' .. n)
  local payload = '{"job":' .. cjson.encode(QUEUE .. '/' .. id) .. ',' .. body .. '}'
  if type(name) == 'table' and name[1] ~= QUEUE then
    -- a name holds no control character: the newline parts it from the payload
    send(base, cjson.encode({k = 'cb', c = key, p = cid, q = name[1],
      v = name[2] .. '\n' .. payload}))
    return
  end
  if type(name) == 'table' then
    name = name[2]
  end
  local row = job_key(base, cid)
  if redis.call('EXISTS', row) == 1 then  -- never rewritten: its state stays its own
    return
  end
  redis.call('HSET', row, F_NAME, name, F_CREATED, now, F_DATA, payload)  -- pending: no `s`
  make_claimable(base, {cid}, nil)
  emit(base, 'added', cid)
end

-- Move a job to dead and, when it is a child, let its policy resolve its
-- parent: on this slot directly, on another slot through this queue's outbox.
-- `up`: killed by its parent's cancel (lib/lifecycle.lua cancel_node), so
-- its death travels as a `cancelled` entry (propagate_death).
local function kill(base, id, err, now, up)
  local key = job_key(base, id)
  local f = row_hmget_s(key, F_STATE, 'dedup', 'keep', 'orphaned', 'lease', 'callbacks',
    'group')
  local state = f[1]
  if state == 'dead' then
    return
  end
  callback(base, id, f[6], 'd', nil, err, now)  -- its on_dead job
  free_dedup(base, f[2], id)
  if state == 'awaiting_children' then
    redis.call('ZREM', base .. 'awaiting', id)
  elseif state == 'active' then
    redis.call('ZREM', base .. 'active', id)  -- the row keeps its last lease: fail's replay check
    left_active(base, f[7] or nil)
  elseif state == 'delayed' then
    redis.call('ZREM', base .. 'delayed', id)
  elseif state == 'pending' then
    unclaimable(base, id, f[7] or nil)
  end
  redis.call('HSET', key, F_STATE, 'dead', 'finished_at', now, 'updated_at', now)
  if f[4] then  -- its flow was removed while it ran: its signals, then it goes
    if err == 'cancelled' then
      signal_event(base, 'cancelled', id, err)
    end
    emit(base, 'dead', id)
    signal_event(base, 'dead', id, err)
    OUT.dead[#OUT.dead + 1] = base .. id
    drop_orphan(base, id, key, f[5], 'd' .. redis.sha1hex(err))
    return
  end
  set_error(key, err)
  redis.call('ZADD', base .. 'dead', now, id)
  if f[3] then  -- its own keep (ms): retention's expire list (lib/lifecycle.lua)
    redis.call('ZADD', base .. 'expire', now + tonumber(f[3]), id)
  end
  if err == 'cancelled' then  -- every road of a cancel: queued, running, stalled
    if state ~= 'awaiting_children' and redis.call('EXISTS', key .. ':children') == 1 then
      -- a parent past waiting (released, or retried after its children timed
      -- out): it went on without its children, and its retry runs it again
      -- (pending), never holding it for them a second time (retry.lua)
      redis.call('HSET', key, 'went_on', now)
    end
    signal_event(base, 'cancelled', id, err)
  end
  emit(base, 'dead', id)
  signal_event(base, 'dead', id, err)
  OUT.dead[#OUT.dead + 1] = base .. id
  propagate_death(base, id, err, now, up)
end

-- The error of a parent an `fp` child killed: 'failed by child <ref>: ' and
-- the first line of the child's error (its summary, 'ExcType: message', at
-- most SUMMARY_CHARS of it; a child that died of its own child keeps its
-- whole 'failed by child ...' chain, each level bounded so). The child's
-- whole error, traceback and all, is in its row and in the parent's :failed:
-- the parent's row does not hold a third copy.
local SUMMARY_CHARS = 1000  -- as the worker's own summary line (pool.error_text)
local function failed_by(ref, err)
  local line = err:match('^[^\n]*')
  if #line > SUMMARY_CHARS and line:sub(1, 16) ~= 'failed by child ' then
    line = line:sub(1, SUMMARY_CHARS - 3) .. '...'
  end
  return 'failed by child ' .. ref .. ': ' .. line
end

-- A dead child resolves its parent by the child's policy (docs/explanation/protocol.md#policies):
--   fp  record in :failed, the parent goes dead (and so on up the tree)
--   id  record in :unsuccessful, decrement, maybe release
--   rd  record in :removed (the guard only), decrement, maybe release
--   cp  record in :unsuccessful, decrement, and release the parent at once
--       (continue_parent_on_failure): resolved like `id`, so
--       its retry never re-attaches and the parent (which reads it in
--       dependencies().ignored) is released only this once: release()
--       wants awaiting_children. A parent it releases early is marked
--       `went_on`: it no longer waits for its other children, so their
--       later `fp` deaths cannot fail it; they resolve it like `id` (else a
--       retry of the parent would revive it for a second release)
local function fan_in_dead(base, pid, ref, err, policy, now, inc)
  local pkey = job_key(base, pid)
  local state, stale = parent_state(pkey, inc)
  if not state then
    return stale
  end
  if already_resolved(pkey, ref) then
    return true
  end
  if policy == 'fp' and redis.call('HEXISTS', pkey, 'went_on') == 1 then
    policy = 'id'
  end
  if policy == 'id' or policy == 'rd' or policy == 'cp' then
    local hash = (policy == 'rd') and ':removed' or ':unsuccessful'
    if redis.call('HSETNX', pkey .. hash, ref, err) == 1 then
      decrement_and_maybe_release(base, pid, now)
      if policy == 'cp' and row_hmget_s(pkey, F_STATE)[1] == 'awaiting_children' then
        redis.call('HSET', pkey, 'went_on', now)
        release(base, pid, now)
      end
    end
    return true
  end
  if redis.call('HSETNX', pkey .. ':failed', ref, err) == 1 then
    local pstate = row_hmget_s(pkey, F_STATE)[1]
    if pstate == 'awaiting_children' then
      local why = failed_by(ref, err)
      OUT.flow_failed[#OUT.flow_failed + 1] = base .. pid
      signal_event(base, 'flow_failed', pid, why)
      kill(base, pid, why, now)
    end
  end
  return true
end

propagate_death = function(base, id, err, now, up)
  local key = job_key(base, id)
  local parent = row_hmget_p(key, F_PARENT, F_PQUEUE, F_POLICY, F_PINC,
    'orphaned', 'cancel')
  if not parent[1] or parent[5] then  -- no parent, or its parent was removed while it ran
    return
  end
  local policy = parent[3] or 'fp'
  local ref = child_ref(base, id)
  if (parent[2] or QUEUE) == QUEUE then
    fan_in_dead(base, parent[1], ref, err, policy, now, parent[4])
  else
    -- died of its parent's cancel (killed by it, or of the mark it left
    -- while it ran): a `cancelled` entry, which a parent retried since does
    -- not die of (lib/lifecycle.lua fan_in_cancelled)
    local kind = 'dead'
    if err == 'cancelled' and (up or (parent[6] and parent[6]:sub(-7) == ':parent')) then
      kind = 'cancelled'
    end
    send(base, cjson.encode({k = kind, c = ref, p = parent[1], q = parent[2], pol = policy,
      v = err, i = parent[4] or nil}))
  end
end

-- On one server (no Cluster: every queue's keys are on this server), a
-- cross-queue child's `done` is applied to its parent on the parent's queue
-- in the completion itself, exactly as deliver_to_parents would apply the
-- entry (docs/explanation/protocol.md#fan-in-on-one-server), when this queue's outbox is
-- empty: an entry still on it (a retry's reattach, a death) must reach the
-- parent first. Returns false, having written nothing, when the entry must
-- go through the outbox instead: the outbox holds entries, or the parent's
-- row is gone (the pump's delivery reports that case).
local function fan_in_here(base, parent, ref, result, now, parent_queue, parent_inc)
  local pbase = string.sub(base, 1, #base - #QUEUE - 3) .. '{' .. parent_queue .. '}:'
  -- a parent kept by an earlier child in this call (FAN_KEPT) is there and
  -- nothing went on this queue's outbox since: both checks are known
  local kept = FAN_KEPT and FAN_KEPT[job_key(pbase, parent)] == (parent_inc or '')
  if not kept and redis.call('LLEN', base .. 'flow:outbox') > 0 then
    return false
  end
  if not kept and redis.call('EXISTS', job_key(pbase, parent)) == 0 then
    return false
  end
  local own = QUEUE
  QUEUE = parent_queue  -- the helpers compare a row's queue with QUEUE, as deliver_to_parents' do
  fan_in_done(pbase, parent, ref, result, now, parent_inc)
  QUEUE = own
  return true
end

-- A job completed: fan its result in to its parent, here or via the outbox.
-- `parent`, `parent_queue` and `parent_inc` are the job's parent id, its queue (nil: this
-- one) and incarnation, from the row's `p` (or `pq`) and `pi`, read
-- by the caller in its own first HMGET (one command less per completion on
-- the hot path); `ref`, its row key when the caller has made it (child_ref).
-- An orphaned job resolves no parent: complete.lua removes it instead
-- (drop_orphan).
local function resolve_done(base, id, result, now, parent, parent_queue, parent_inc, ref)
  if not parent then
    return
  end
  ref = ref or child_ref(base, id)
  if (parent_queue or QUEUE) == QUEUE then
    fan_in_done(base, parent, ref, result, now, parent_inc)
  elseif not (ONE_SERVER and fan_in_here(base, parent, ref, result, now, parent_queue,
      parent_inc)) then
    send(base, cjson.encode({k = 'done', c = ref, p = parent, q = parent_queue, v = result,
      i = parent_inc or nil}))
  end
end
