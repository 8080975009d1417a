--[[
  drop_unprocessed: delete children that have not started (pending or
  delayed) of one parent, on the children's slot; the second half of
  remove_unprocessed_children (docs/explanation/protocol.md#removing-a-dependency), run after the parent stopped
  waiting for them (remove_child_dependency), so a crash in between leaves a
  child that runs for nothing, never a parent that waits for ever. A child
  that started, finished, holds children of its own (held, or released by
  them: its keys beside the row would stay behind), or no longer names this
  parent is left alone.

  KEYS[1] pending list         P:{q}:pending
  KEYS[2] delayed zset         P:{q}:delayed

  ARGV[1] queue key prefix     P:{q}:
  ARGV[2] parent id
  ARGV[3] parent's queue name
  ARGV[4..] child ids on this queue, 1 values each

  returns: the ids deleted (array)
  errors:  none
]]
-- @include lib/row.lua
-- @include lib/claimable.lua
-- @include lib/emit.lua
local pending, delayed = KEYS[1], KEYS[2]
local base, pid, pq = ARGV[1], ARGV[2], ARGV[3]
local QUEUE = base:match('{(.*)}')

local out = {}
for i = 4, #ARGV do
  local id = ARGV[i]
  local row = base .. 'job:' .. id
  local f = row_hmget_p(row, F_STATE, F_PARENT, F_PQUEUE, 'dedup', 'group')
  if f[2] == pid and (f[3] or QUEUE) == pq and (f[1] == 'pending' or f[1] == 'delayed')
      and redis.call('EXISTS', row .. ':children') == 0 then  -- not a parent its children released
    if f[1] == 'pending' then
      unclaimable(base, id, f[5] or nil)  -- the pending list, P:{q}:prioritized, or its group's
    else
      redis.call('ZREM', delayed, id)
    end
    if f[4] and redis.call('GET', base .. 'dedup:' .. f[4]) == id then
      redis.call('DEL', base .. 'dedup:' .. f[4])
    end
    redis.call('DEL', row, row .. ':logs', row .. ':errors')  -- a delayed one may have run
    emit_to(base .. 'events', 'removed', id)
    out[#out + 1] = id
  end
end
return out
