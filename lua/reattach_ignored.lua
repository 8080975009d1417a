--[[
  reattach_ignored: the parent's half of retrying a dead child on another
  slot that the parent ignored (`ignore_dependency_on_failure`), run on the
  parent's slot BEFORE the child's `retry` (docs/explanation/lifecycle.md,
  "Retrying a child its parent ignored"). While the parent has not gone on
  without the child (it waits, or is dead and may be retried itself) the
  child leaves the parent's :unsuccessful and the counter counts it again,
  in this one step: no release can slip in between, so the child's next
  completion or death resolves the parent once more. A parent that went on
  (released since) refuses, and nothing is written anywhere: the same
  EMQPARENT the same-slot retry answers. A child not in :unsuccessful (its
  death is still on its way: its retry takes it back from its outbox; or
  it re-attached already) and a parent gone, or of another incarnation,
  change nothing.

  KEYS[1] parent row           P:{pq}:job:<parent id>

  ARGV[1] parent's queue name
  ARGV[2] parent's queue key prefix   P:{pq}:
  ARGV[3] parent id
  ARGV[4] child ref            P:{q}:job:<child id>
  ARGV[5] the parent's incarnation the child holds (`pi`; '' for none)
  ARGV[6] child's queue name (for the error)
  ARGV[7] child id (for the error)

  returns: 1 when the child was re-attached (the caller undoes it with a
           `gone` delivery if the child's retry then finds no child), 0 when
           nothing was to do
  errors:  EMQPARENT <queue> <id> <parent queue> <parent id> <state>  the
           parent ignored the child's death and has been released since
]]
local prow = KEYS[1]
local QUEUE = ARGV[1]
-- @include lib/flow.lua
local pid, ref = ARGV[3], ARGV[4]
local inc = (ARGV[5] ~= '') and ARGV[5] or nil

local state = parent_state(prow, inc)
if not state or redis.call('HEXISTS', prow .. ':unsuccessful', ref) == 0 then
  return 0
end
if state ~= 'awaiting_children' and state ~= 'dead' then
  return redis.error_reply('EMQPARENT ' .. ARGV[6] .. ' ' .. ARGV[7] .. ' ' .. QUEUE .. ' ' .. pid
    .. ' ' .. state)
end
redis.call('HDEL', prow .. ':unsuccessful', ref)
redis.call('INCR', prow .. ':dependencies')
return 1
