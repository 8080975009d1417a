--[[
  deliver_to_parents: deliver outbox entries on this slot
  (docs/explanation/protocol.md#fan-in-across-slots): every entry kind in one script, so
  a batch keeps the outbox's order. Every entry is guarded, so a
  re-delivery changes nothing:
    done      HSETNX :processed, decrement, release at zero
    dead      apply the child's policy once (fp: parent dead; id / rd:
              record, decrement, maybe release)
    reattach  a retried child leaves the parent's :failed (maybe reviving it);
              with policy 'id', its :unsuccessful, counted again while the
              parent is not released
    gone      a removed child resolves its parent like remove_dependency
              (docs/explanation/lifecycle.md: out of :failed, into :removed, decrement)
    cancelled a child its parent's cancel marked while it ran died of the
              mark: a parent that waits again (a retry took its cancel
              back) sends it a `rerun` entry instead of dying of it; any
              other parent takes it as `dead`
  and two kinds whose target is a child on this slot (`parent id` is then
  the child's id and `value` its parent's id: a child already gone, or now
  under another parent or another incarnation of it, counts as delivered
  and is not touched):
    rm        its parent was removed: the child goes too, with its subtree
              (continued by `prune`)
    cancel    its parent was cancelled: the child is cancelled (docs/explanation/lifecycle.md)
    rerun     its parent's cancel was taken back after the child died of it
              (a `cancelled` entry): the child runs again (pending)
  and one kind that adds a job on this slot:
    cb        a callback of a job on another queue (lib/flow.lua callback;
              `parent id` is the callback job's id, `value` its handler name,
              a newline and its payload JSON): written pending unless a row
              of that id exists already (a re-delivery)

  KEYS[1] pending list         P:{pq}:pending   (pq = the parents' queue)
  KEYS[2] awaiting zset        P:{pq}:awaiting

  ARGV[1] parents' queue name
  ARGV[2] parents' queue key prefix   P:{pq}:
  ARGV[3] now (ms)
  ARGV[4..] entries, 6 values each: kind, child ref, parent id, policy, value
           (the result JSON for done, the error text for dead, '' otherwise),
           incarnation (the parent's `inc` the entry was meant for; '' for
           an entry written without one)

  An entry whose incarnation is not its parent's `inc` was meant for a
  removed flow whose ids were added again (lib/flow.lua, docs/explanation/lifecycle.md): it
  counts as delivered (it leaves the outbox) and changes nothing.

  returns: JSON {delivered: [1|0 per entry; 0 = the parent row is gone],
           released, dead, flow_failed, revived, retried, reattach, outbox, sent,
           stale (entries dropped for their incarnation)}
  errors:  none
]]
local QUEUE = ARGV[1]
-- @include lib/flow.lua
-- @include lib/lifecycle.lua
local base, now = ARGV[2], tonumber(ARGV[3])

-- a `cb` entry: the callback job, once (docs/howto/retries.md#callbacks-on-another-queue)
local function add_callback(cid, value)
  local row = job_key(base, cid)
  if redis.call('EXISTS', row) == 1 then
    return
  end
  local cut = value:find('\n', 1, true)
  if not cut then  -- the host dead-letters such an entry before it gets here
    return
  end
  redis.call('HSET', row, F_NAME, value:sub(1, cut - 1), F_CREATED, now,  -- pending: no `s`
    F_DATA, value:sub(cut + 1))
  make_claimable(base, {cid}, nil)
  emit(base, 'added', cid)
end

OUT.delivered = {}
for i = 4, #ARGV, 6 do
  local kind, ref, pid, policy, value = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  local inc = (ARGV[i + 5] ~= '') and ARGV[i + 5] or nil
  local ok, state, stale = true, nil, false
  local aimed_at_child = kind == 'rm' or kind == 'cancel' or kind == 'rerun'
  if not aimed_at_child and kind ~= 'cb' then
    state, stale = parent_state(job_key(base, pid), inc)
  end
  if kind == 'cb' then
    add_callback(pid, value)
  elseif aimed_at_child then
    if kind == 'rm' then
      drop_node(base, pid, value, inc)
    elseif kind == 'cancel' then
      cancel_node(base, pid, now, value, inc)
    else
      rerun_child(base, pid, value, inc, now)
    end
  elseif not state then
    ok = stale  -- gone: false; meant for a removed incarnation of this parent: delivered
  elseif kind == 'done' then
    ok = fan_in_done(base, pid, ref, value, now)
  elseif kind == 'dead' then
    ok = fan_in_dead(base, pid, ref, value, policy, now)
  elseif kind == 'cancelled' then
    ok = fan_in_cancelled(base, pid, ref, value, policy, now, state, inc)
  elseif kind == 'gone' then
    reattach(base, pid, ref, now)
    ok = fan_in_dead(base, pid, ref, value, 'rd', now)
  elseif kind == 'reattach' and policy == 'id' then
    reattach_ignored(base, pid, ref)
    ok = true
  else
    reattach(base, pid, ref, now)
    ok = true
  end
  OUT.delivered[#OUT.delivered + 1] = ok and 1 or 0
end
return cjson.encode(OUT)
