--[[
  cancel: a pending, delayed or awaiting job dies now with the error
  'cancelled' and its parent's policy applies (docs/explanation/lifecycle.md); an awaiting
  one's unfinished subtree is cancelled after it, top down, `budget` units
  at a time (this call starts it, `prune` goes on; the host calls it while
  more = 1); children on other slots get `cancel` entries. An active job is
  marked instead: its row gets `cancel` = now, and its worker's next
  heartbeat (EMQCANCELLED), completion (EMQCANCELLED, the result is dropped
  and the job dies) or failure (it dies) learns it; so does a lease expiry.

  KEYS[1] job row              P:{q}:job:<id>

  ARGV[1] queue name
  ARGV[2] queue key prefix     P:{q}:
  ARGV[3] job id
  ARGV[4] now (ms)
  ARGV[5] budget: units of subtree work this call may do (integer >= 1)
  ARGV[6] call token: a fresh random string per call; the reply is kept
          under P:{q}:op:<token> for 10 minutes, so a replay of the same call
          answers the same instead of EMQSTATE

  returns: JSON {state: the state found ('active': marked, else now dead),
           more: 0|1, sent: [outbox entries for other slots], outbox, dead,
           released, flow_failed}
  errors:  EMQNOJOB <queue> <id>            no such job
           EMQSTATE <queue> <id> <state>    completed or dead: nothing to cancel
]]
local row = KEYS[1]
local QUEUE = ARGV[1]
-- @include lib/flow.lua
-- @include lib/lifecycle.lua
local base, id, now = ARGV[2], ARGV[3], tonumber(ARGV[4])
LEFT = tonumber(ARGV[5])

local early = replay_or_refuse(base, row, id, ARGV[6], {completed = true, dead = true})
if early then
  return early
end
OUT.state = cancel_node(base, id, now)
cancel_run(base, now)
OUT.more = (LEFT <= 0) and 1 or 0
return remember(base, ARGV[6], cjson.encode(OUT))
