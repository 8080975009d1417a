--[[
  lib/lifecycle.lua: retention, removal and cancellation helpers
  (docs/explanation/lifecycle.md), inlined after lib/flow.lua (they use its emit, kill, reattach,
  fan_in_dead and OUT). Local functions only; no key is touched until a
  script calls them.

  Work that grows with a flow's size is never done in one call. Two per-queue
  work lists carry it from call to call, each step bounded by a budget the
  caller passes (one unit per node touched or child ref read):
    P:{q}:gc         the lists of child refs of removed parents still to go:
                     P:{q}:gc:<seq>:<id> (the parent's :children, renamed),
                     P:{q}:gc:<seq>-<inc>:<id> for a parent with an
                     incarnation (lib/flow.lua), which its `rm` entries carry
    P:{q}:cancel     'id offset inc' items: an awaiting parent whose children
                     from `offset` on still have to be cancelled (`inc` its
                     incarnation when cancelled, '-' for none: a parent
                     removed and added again meanwhile is not this one)
  A child on another slot is reached through this queue's outbox, as fan-in
  is: an `rm` or `cancel` entry the pump (or the calling host) delivers to
  the child's slot, where the same helpers run.

  Flow rules for a finished node X (completed or dead) that retention picks:
    * X goes when it has no parent, its parent row is gone, or its parent
      holds X's outcome (:processed, :unsuccessful or :removed);
    * X stays (held) while its parent may still retry it: X is in the
      parent's :failed (an `fp` death). On another slot the parent cannot be
      read: a dead `fp` child there is held until its parent's removal reaches
      it (an `rm` entry);
    * X goes with its whole subtree (a finished flow goes as a whole); a
      parent's :processed is deleted with the parent row, never before.
  A held node is re-scored to `now` in its index, so it never blocks the
  oldest-first walk.
]]

OUT.sent = {}  -- outbox entries pushed for other slots, for the host to deliver at once
local LEFT = 0  -- budget left in this call
local PASS = nil  -- prune: when this pass began (ms); a row held at or after it was held in this pass
local REHELD = 0  -- prune: units spent on rows held already in this pass
local PARENTS = {}  -- settled(): parent id -> how many of its row and its :failed exist (0-2)

local function push_entry(base, entry)
  local text = cjson.encode(entry)
  if entry.k == 'cancel' then
    cancel_entry_pushed(base, entry.v)
  end
  push_outbox(base, text)
  OUT.outbox = OUT.outbox + 1
  OUT.sent[#OUT.sent + 1] = text
end

-- ref 'P:{q}:job:<id>' -> q, id
local function split_ref(ref)
  return ref:match('{(.-)}:job:(.+)$')
end

-- Each child of list entries `refs` costs one unit: a child on this slot is
-- handed to `here(child id)`, one on another slot gets a `kind` entry naming
-- its parent `parent` and that parent's incarnation `inc` (or nil) (the
-- pump, or the calling host, delivers it there). The caller read as many
-- entries as it can spend units on: they are taken whole (a range's
-- children all, lib/row.lua child_range) until as many children were: returns
-- how many entries were taken (at least one), so a step overruns its budget
-- by less than one range.
local function each_child(base, refs, kind, parent, here, inc)
  local mine, want = base .. 'job:', #refs
  for i = 1, #refs do
    for _, ref in ipairs(child_keys(base, parent, refs, i, i)) do  -- any form the list holds
      LEFT, want = LEFT - 1, want - 1
      if ref:sub(1, #mine) == mine then
        here(ref:sub(#mine + 1))
      else
        local q, cid = split_ref(ref)
        push_entry(base, {k = kind, c = ref, p = cid, q = q, v = parent, i = inc})
      end
    end
    if want <= 0 then
      return i
    end
  end
  return #refs
end

-- The opening remove and cancel share: a replayed call (same token)
-- answers its first reply; no row answers EMQNOJOB; a row whose state is in
-- `refused` (a set: state -> true) answers EMQSTATE. Returns the reply the
-- script returns at once, or nil when the call goes on.
local function replay_or_refuse(base, row, id, token, refused)
  local again = redis.call('GET', base .. 'op:' .. token)
  if again then
    return again
  end
  local state = row_hmget_s(row, F_STATE)[1]
  if not state then
    return redis.error_reply('EMQNOJOB ' .. QUEUE .. ' ' .. id)
  end
  if refused[state] then
    return redis.error_reply('EMQSTATE ' .. QUEUE .. ' ' .. id .. ' ' .. state)
  end
  return nil
end

local function remember(base, token, reply)
  redis.call('SET', base .. 'op:' .. token, reply, 'PX', 600000)
  return reply
end

local function unindex(base, id, state, group)
  if state == 'pending' then
    unclaimable(base, id, group)  -- the pending list, P:{q}:prioritized, or its group's
  elseif state == 'awaiting_children' then
    redis.call('ZREM', base .. 'awaiting', id)
  elseif state then
    redis.call('ZREM', base .. state, id)  -- active, delayed, completed, dead
    if state == 'active' then
      left_active(base, group)
    end
  end
end

-- The parts of a row's removal its fields call for: out of P:{q}:expire
-- (its own keep), its dedup key freed, out of P:{q}:deadlines.
local function drop_extras(base, id, dedup, deadline, keep)
  if keep then
    redis.call('ZREM', base .. 'expire', id)
  end
  if dedup then
    free_dedup(base, dedup, id)
  end
  if deadline then
    redis.call('ZREM', base .. 'deadlines', id)
  end
end

-- Delete a row whose fields were read already (`state` not active): out of
-- its index, the extras its fields call for, its keys gone (a leaf has no
-- hashes of its own: only its row, job log and earlier errors), a `removed`
-- event for the mirror. An unfinished job's waiters are told (a finished
-- one's were, when it finished): they wake with JobNotFound at once
-- (docs/explanation/protocol.md#waiting-for-a-result).
local function drop_row(base, id, state, dedup, deadline, keep, group)
  local key = base .. 'job:' .. id
  if state ~= 'completed' and state ~= 'dead' then
    note_done(base .. 'done:' .. id, 'removed')
  end
  unindex(base, id, state, group)
  drop_extras(base, id, dedup, deadline, keep)
  if redis.call('EXISTS', key .. ':children') == 1 then
    drop_parent_keys(base, id)
  else
    redis.call('UNLINK', key, key .. ':logs', key .. ':errors')
  end
  emit(base, 'removed', id)
  OUT.removed = (OUT.removed or 0) + 1
end

-- Retention drops rows a block at a time (keep_rule): the ids of one
-- index's block are collected in GOING and removed together by
-- flush_going, with one command per kind of work instead of one per row
-- (one ZREM, one EXISTS over their :children, one UNLINK, one `removed`
-- event whose id field holds the block's ids, space-separated). A row's own
-- `keep` and children deadline are not read per row: a finished row that
-- has them is in P:{q}:expire / P:{q}:deadlines (or has left it), so the
-- block leaves both with one ZREM each, when the zset exists (one EXISTS
-- per block for the two). Nothing in a block reads a row another id of the
-- same block drops: the block is flushed before the next read of its index
-- and before any other step.
local GOING = {}
local GOING_ROWS = {}  -- their row keys, as retire built them

local function flush_going(base, index)
  local n = #GOING
  if n == 0 then
    return
  end
  redis.call('ZREM', base .. index, unpack(GOING))
  if redis.call('EXISTS', base .. 'expire', base .. 'deadlines') > 0 then
    redis.call('ZREM', base .. 'expire', unpack(GOING))
    redis.call('ZREM', base .. 'deadlines', unpack(GOING))
  end
  local rows, kids = GOING_ROWS, {}
  for i = 1, n do
    kids[i] = rows[i] .. ':children'
  end
  local parents = redis.call('EXISTS', unpack(kids))
  if parents > 0 then
    local leaves = {}
    for i = 1, n do
      if parents > 0 and redis.call('EXISTS', kids[i]) == 1 then
        parents = parents - 1
        drop_parent_keys(base, GOING[i])
      else
        leaves[#leaves + 1] = rows[i]
      end
    end
    rows = leaves
  end
  if #rows > 0 then
    local going = {}  -- each leaf's row, job log and earlier errors (block <= 100 rows)
    for i = 1, #rows do
      going[3 * i - 2], going[3 * i - 1], going[3 * i] = rows[i], rows[i] .. ':logs',
        rows[i] .. ':errors'
    end
    redis.call('UNLINK', unpack(going))
  end
  emit(base, 'removed', run_text(GOING))
  OUT.removed = (OUT.removed or 0) + n
  GOING, GOING_ROWS = {}, {}
end

-- Delete one node's row and its own hashes now; its child refs move to the
-- gc list (their rows go in later steps). An active node is left alone: it
-- finishes on its own (its fan-in finds no parent) and retention takes it;
-- reached from its removed parent it is marked `orphaned`, so retention
-- takes it even when it dies `fp` on another slot than its parent (where
-- the parent cannot be read, and that parent's removal has come already).
-- `parent`, when given, must be the row's parent, and `inc`, when given,
-- that parent's incarnation as the row knows it (a child reached from its
-- removed parent: an id landed again under another flow, or under the same
-- ids added again, is not touched). Returns true when the row went.
local function drop_node(base, id, parent, inc)
  local f = row_hmget_p(base .. 'job:' .. id, F_STATE, F_PARENT, 'dedup',
    'children_deadline', 'keep', F_PINC, 'group')
  if not f[1] or (parent and f[2] ~= parent) or (inc and f[6] and f[6] ~= inc) then
    return false
  end
  if f[1] == 'active' then
    if parent then  -- its parent is gone: once it finishes, nothing may retry it
      redis.call('HSET', base .. 'job:' .. id, 'orphaned', '1')
    end
    return false
  end
  drop_row(base, id, f[1], f[3], f[4], f[5], f[7] or nil)
  return true
end

-- Drain the gc list within the budget: drop the next child of each removed
-- parent (same slot), or send an `rm` entry to its slot.
local function gc_run(base)
  while LEFT > 0 do
    local bin = redis.call('LINDEX', base .. 'gc', 0)
    if not bin then
      return
    end
    local refs = redis.call('LRANGE', bin, 0, math.min(LEFT, 100) - 1)
    local seq, parent = bin:match('gc:([^:]+):([^:]+)$')
    local inc = seq:match('-(.+)$')
    if #refs == 0 then
      redis.call('LPOP', base .. 'gc')
    else
      local taken = each_child(base, refs, 'rm', parent,
        function(cid) drop_node(base, cid, parent, inc) end, inc)
      redis.call('LTRIM', bin, taken, -1)
    end
  end
end

-- A removed child resolves its parent like `remove_dependency`
-- (docs/explanation/lifecycle.md#remove): out of the parent's :failed (a dead parent may revive), recorded in
-- :removed, one decrement, release at zero. Guarded: a child that resolved
-- its parent already changes nothing. Another slot: a `gone` entry.
local function resolve_removed(base, id, now)
  local f = row_hmget_p(base .. 'job:' .. id, F_PARENT, F_PQUEUE, F_PINC,
    'orphaned')
  if not f[1] or f[4] then  -- no parent, or its parent was removed while it ran
    return
  end
  local ref = base .. 'job:' .. id
  if (f[2] or QUEUE) == QUEUE then
    if not parent_state(base .. 'job:' .. f[1], f[3]) then
      return  -- its parent is gone, or another incarnation: nothing to resolve
    end
    reattach(base, f[1], ref, now)
    fan_in_dead(base, f[1], ref, 'removed', 'rd', now)
  else
    push_entry(base, {k = 'gone', c = ref, p = f[1], q = f[2], v = 'removed', i = f[3] or nil})
  end
end

-- Cancel one node (docs/explanation/lifecycle.md): pending / delayed / awaiting die now with
-- the error 'cancelled' (their parent's policy applies); an awaiting one
-- queues its children for cancelling; an active one is marked (its worker
-- learns it at its next heartbeat or report). `parent` and `inc` as for
-- drop_node. Returns the state it found.
local function cancel_node(base, id, now, parent, inc)
  local key = base .. 'job:' .. id
  local f = row_hmget_p(key, F_STATE, F_PARENT, F_PINC)
  local state = f[1]
  if (parent and f[2] ~= parent) or (inc and f[3] and f[3] ~= inc) then
    return nil  -- an id landed again under another flow, or the same ids again
  end
  if state == 'active' then
    -- a mark its parent's cancel left says so: its death by the mark is the
    -- parent's cancel, which a retry of the parent takes back (rerun_child)
    redis.call('HSET', key, 'cancel', parent and string.format('%s:parent', now) or now)
    emit(base, 'cancelling', id)
  elseif state == 'pending' or state == 'delayed' or state == 'awaiting_children' then
    -- reached from its parent, a queued job's death is the parent's cancel
    -- (a `cancelled` entry across slots); a held one's is not: its own
    -- subtree dies with it, and it cannot simply run again (rerun_child)
    kill(base, id, 'cancelled', now, parent ~= nil and state ~= 'awaiting_children')
    PARENTS = {}  -- its death may have put it in its parent's :failed
    emit(base, 'cancelled', id)
    if state == 'awaiting_children' then
      redis.call('RPUSH', base .. 'cancel', id .. ' 0 ' .. (redis.call('HGET', key, 'inc') or '-'))
    end
  end
  return state
end

-- Cancel queued children within the budget, top down.
local function cancel_run(base, now)
  while LEFT > 0 do
    local item = redis.call('LPOP', base .. 'cancel')
    if not item then
      return
    end
    local id, offset, was = item:match('^(%S+) (%d+) ?(%S*)$')
    offset = tonumber(offset)
    local inc = redis.call('HGET', base .. 'job:' .. id, 'inc') or '-'
    local n = (was == '' or was == inc) and math.min(LEFT, 100) or 0
    local refs = (n > 0)
      and redis.call('LRANGE', base .. 'job:' .. id .. ':children', offset, offset + n - 1) or {}
    LEFT = LEFT - 1
    local was_inc = inc
    inc = (inc ~= '-') and inc or nil
    local taken = each_child(base, refs, 'cancel', id,
      function(cid) cancel_node(base, cid, now, id, inc) end, inc)
    if n > 0 and (#refs == n or taken < #refs) then  -- the rest next (at the front)
      redis.call('LPUSH', base .. 'cancel', id .. ' ' .. (offset + taken) .. ' ' .. was_inc)
    end
  end
end

-- May retention take this finished node now? (the flow rules above)
-- `f` holds the row's parent, parent_queue and parent_policy (retire's read),
-- and at 5 `orphaned` (set when its parent's removal reached it while it ran).
-- What a call learnt of a same-slot parent (its row exists; it has a
-- :failed hash) is kept for the rest of the call, by parent id (a script
-- runs on one queue): siblings ask the same.
local function settled(base, id, state, f)
  if not f[1] or f[5] then  -- no parent, or its parent was removed while it ran
    return true
  end
  if f[2] and f[2] ~= QUEUE then
    return not (state == 'dead' and (f[3] or 'fp') == 'fp')
  end
  local known = PARENTS[f[1]]
  if not known then
    local pkey = base .. 'job:' .. f[1]
    known = redis.call('EXISTS', pkey, pkey .. ':failed')
    PARENTS[f[1]] = known
  end
  if known < 2 then  -- the row is gone, or has no :failed: nothing may retry X
    return true
  end
  return redis.call('HEXISTS', base .. 'job:' .. f[1] .. ':failed', base .. 'job:' .. id) == 0
end

-- Retention of one finished node picked from `index` (completed or dead):
-- drop it when settled (`batch`: into GOING, for the caller to flush),
-- else re-score it to now (held). Costs one unit; returns true when the row
-- went. Reads only the fields the flow rules need: the row's `keep` and
-- children deadline are not read (their zsets are left by id: flush_going;
-- drop_row here), nor its `dedup`: every road to completed or dead frees
-- the key while it names the row (complete.lua, kill), and nothing names a
-- finished row again (enqueue and enqueue_flow set a key for a new row
-- only), so a finished row holds no dedup key.
local function retire(base, index, id, now, batch)
  LEFT = LEFT - 1
  local row = base .. 'job:' .. id
  local f = row_hmget_p(row, F_PARENT, F_PQUEUE, F_POLICY, F_STATE,
    'orphaned')
  local state = f[4]
  if state ~= 'completed' and state ~= 'dead' then
    redis.call('ZREM', base .. index, id)  -- a stray id: its row is gone or moved
    return true
  end
  if settled(base, id, state, f) then
    if batch and state == index then
      GOING[#GOING + 1] = id
      GOING_ROWS[#GOING] = row
    else
      drop_row(base, id, state, nil, true, true)
    end
    return true
  end
  local was = tonumber(redis.call('ZSCORE', base .. index, id))
  redis.call('ZADD', base .. index, 'XX', now, id)
  OUT.held = (OUT.held or 0) + 1
  if PASS and was and was >= PASS then  -- held already in this pass
    REHELD = REHELD + 1
    return false, true
  end
  return false
end

-- Apply a queue rule to one index, oldest first: an id goes while the index
-- holds more than `count`, or when it finished before now - age_ms. Each id
-- is looked at once per call at most (a held one moves to the back). Rows
-- go a block (up to 100) at a time: flush_going. The ids are read without
-- their scores (Redis formats each score as text: a tenth of a pruned row's
-- cost): the `old` ids that finished before the cutoff, counted once, are
-- the head of the walk, since every id it has looked at left the head
-- (gone, or held and re-scored to now, which is after the cutoff).
local function keep_rule(base, index, count, age_ms, now)
  local key = base .. index
  local size = redis.call('ZCARD', key)
  local excess, seen = size - count, 0
  local old = redis.call('ZCOUNT', key, '-inf', '(' .. string.format('%.0f', now - age_ms))
  while LEFT > 0 and seen < size and (excess > 0 or seen < old) do
    local head = redis.call('ZRANGE', key, 0, math.min(LEFT, 100) - 1)
    if #head == 0 then
      return
    end
    local stop = false
    for i = 1, #head do
      if LEFT <= 0 or seen >= size or (excess <= 0 and seen >= old) then
        stop = true
        break
      end
      seen = seen + 1
      local _, again = retire(base, index, head[i], now, true)
      if again then  -- the rest were looked at in this pass already (or are newer)
        stop = true
        break
      end
      excess = excess - 1  -- a held one counts too: it is older than the newest `count`
    end
    flush_going(base, index)
    if stop then
      return
    end
  end
end

-- A node's own `keep` (docs/explanation/lifecycle.md): when it finishes, the row's `keep`
-- field (ms to keep it) puts it in P:{q}:expire at finished-at + keep.
local function expire_run(base, now)
  if LEFT <= 0 then
    return
  end
  local due = redis.call('ZRANGEBYSCORE', base .. 'expire', '-inf', now, 'LIMIT', 0, LEFT)
  for _, id in ipairs(due) do
    local state = row_hmget_s(base .. 'job:' .. id, F_STATE)[1]
    if state == 'completed' or state == 'dead' then
      retire(base, state, id, now)
      if redis.call('EXISTS', base .. 'job:' .. id) == 1 then
        redis.call('ZADD', base .. 'expire', now + 60000, id)  -- held: look again in a minute
      end
    else
      LEFT = LEFT - 1
      redis.call('ZREM', base .. 'expire', id)  -- retried, or gone: its next finish re-adds it
    end
  end
end

-- Called where a job finishes: a row with its own keep enters P:{q}:expire.
local function expire_at(base, id, keep, now)
  if keep then
    redis.call('ZADD', base .. 'expire', now + tonumber(keep), id)
  end
end

-- A running child the cancel of its parent (on another slot) marked died of
-- that mark (a `cancelled` entry: lib/flow.lua propagate_death), and reaches
-- its parent here. A parent that waits again had its cancel taken back by a
-- retry (a cancel kills the parent before its children): the death is the
-- old cancel's, so it does not fail the parent; the child is run again
-- instead (a `rerun` entry to its slot), and the parent, still counting it,
-- runs once it is done (docs/explanation/lifecycle.md,
-- "A retried parent and its running child on another slot"). A parent still
-- dead, or past waiting, takes it as any death.
local function fan_in_cancelled(base, pid, ref, err, policy, now, state, inc)
  local pkey = job_key(base, pid)
  if state == 'awaiting_children' and not already_resolved(pkey, ref)
      and redis.call('HEXISTS', pkey .. ':failed', ref) == 0 then
    local q, cid = split_ref(ref)
    push_entry(base, {k = 'rerun', c = ref, p = cid, q = q, v = pid, i = inc})
    return true
  end
  return fan_in_dead(base, pid, ref, err, policy, now)
end

-- The child's half (a `rerun` entry on its slot): a dead child of `parent`
-- (of incarnation `inc`) that died of its parent's cancel goes back to
-- pending, as by a retry of it; anything else is left as it is (retried
-- already, removed, or under another flow).
local function rerun_child(base, id, parent, inc, now)
  local key = job_key(base, id)
  local f = row_hmget_p(key, F_STATE, F_PARENT, F_PINC, 'priority', 'group')
  if f[1] ~= 'dead' or f[2] ~= parent or (inc and f[3] and f[3] ~= inc)
      or get_error(key) ~= 'cancelled' then
    return
  end
  redis.call('ZREM', base .. 'dead', id)
  redis.call('ZREM', base .. 'expire', id)
  redis.call('HSET', key, F_STATE, 'pending', 'attempts', 0, 'stalls', 0, 'updated_at', now)
  redis.call('HDEL', key, 'finished_at', 'result', 'cancel', 'expires_at')
  clear_error(key)
  make_claimable(base, {id}, f[4], false, f[5] or nil)
  emit(base, 'retried', id)
  OUT.retried = OUT.retried or {}
  OUT.retried[#OUT.retried + 1] = base .. id
end
