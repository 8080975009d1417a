--[[
  remove: remove a job that is not active, with its whole subtree
  (docs/explanation/lifecycle.md#remove). A removed child resolves its parent like `remove_dependency`: it
  leaves the parent's :failed, is recorded in :removed, and the parent goes
  on (one decrement, released at zero); a parent on another slot gets a
  `gone` entry on this queue's outbox. The job's row goes now; its subtree
  goes `budget` units at a time: this call starts it, `prune` goes on (the
  host calls it while more = 1). Children on other slots get `rm` entries.
  Active nodes inside the subtree are left to finish (retention takes them).

  KEYS[1] job row              P:{q}:job:<id>

  ARGV[1] queue name
  ARGV[2] queue key prefix     P:{q}:
  ARGV[3] job id
  ARGV[4] now (ms)
  ARGV[5] budget: units of subtree work this call may do (integer >= 1)
  ARGV[6] call token: a fresh random string per call; the reply is kept
          under P:{q}:op:<token> for 10 minutes, so a replay of the same call
          answers the same instead of EMQNOJOB

  returns: JSON {removed: n, more: 0|1, sent: [outbox entries for other
           slots], outbox, released, dead, flow_failed, revived}
  errors:  EMQNOJOB <queue> <id>            no such job
           EMQSTATE <queue> <id> active     an active job is not removed
]]
local row = KEYS[1]
local QUEUE = ARGV[1]
-- @include lib/flow.lua
-- @include lib/lifecycle.lua
local base, id, now = ARGV[2], ARGV[3], tonumber(ARGV[4])
LEFT = tonumber(ARGV[5])

local early = replay_or_refuse(base, row, id, ARGV[6], {active = true})
if early then
  return early
end
resolve_removed(base, id, now)
drop_node(base, id)
gc_run(base)
OUT.more = (LEFT <= 0) and 1 or 0
return remember(base, ARGV[6], cjson.encode(OUT))
