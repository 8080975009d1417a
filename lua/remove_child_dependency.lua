--[[
  remove_child_dependency: a held parent stops waiting for some of its
  children (docs/explanation/protocol.md#removing-a-dependency; BullMQ's removeChildDependency). Each
  child ref is recorded in the parent's :removed (the same exactly-once guard
  as a `remove_dependency` death, docs/explanation/protocol.md#policies) and the counter decremented; at
  zero the parent is released. The child itself is not touched (it may live on
  another slot): if it finishes later, the guard makes its fan-in a no-op.

  KEYS[1] parent row           P:{q}:job:<parent id>

  ARGV[1] parent's queue name
  ARGV[2] parent's queue key prefix   P:{q}:
  ARGV[3] parent id
  ARGV[4] now (ms)
  ARGV[5] strict: '1' refuses the whole call when a ref is not an unresolved
          child; '0' skips such refs (remove_unprocessed_children)
  ARGV[6..] child refs (full job keys), 1 values each

  returns: JSON {removed: [refs whose dependency was removed], released, dead,
           flow_failed, revived, reattach, outbox}
  errors:  EMQNOJOB <queue> <id>           no such parent
           EMQSTATE <queue> <id> <state>   the parent is not awaiting_children
           EMQDEP <queue> <id> <ref> <why> (strict) the ref is not a child of
                                           the parent, or has resolved it already;
                                           nothing is written
]]
local prow = KEYS[1]
local QUEUE = ARGV[1]
-- @include lib/flow.lua
local base, pid, now, strict = ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5] == '1'

local state = row_hmget_s(prow, F_STATE)[1]
if not state then
  return redis.error_reply('EMQNOJOB ' .. QUEUE .. ' ' .. pid)
end
if state ~= 'awaiting_children' then
  return redis.error_reply('EMQSTATE ' .. QUEUE .. ' ' .. pid .. ' ' .. state)
end

local todo = {}
for i = 6, #ARGV do
  local ref = ARGV[i]
  local why = nil
  if not child_listed(prow .. ':children', base, pid, ref) then  -- any form (lib/row.lua)
    why = 'is not a child of this parent'
  elseif already_resolved(prow, ref) or redis.call('HEXISTS', prow .. ':failed', ref) == 1 then
    why = 'has resolved its parent already'
  end
  if why and strict then
    return redis.error_reply('EMQDEP ' .. QUEUE .. ' ' .. pid .. ' ' .. ref .. ' ' .. why)
  end
  if not why then
    todo[#todo + 1] = ref
  end
end

OUT.removed = {}
for _, ref in ipairs(todo) do
  if redis.call('HSETNX', prow .. ':removed', ref, 'dependency removed') == 1 then
    OUT.removed[#OUT.removed + 1] = ref
    decrement_and_maybe_release(base, pid, now)
  end
end
return cjson.encode(OUT)
