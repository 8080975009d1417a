--[[
  prune: one bounded step of the queue's lifecycle work (docs/explanation/lifecycle.md): go on
  cancelling queued subtrees, go on removing the children of removed parents,
  drop finished jobs whose own `keep` ran out, then apply the queue's
  retention to completed and dead, oldest first. Flow-aware: see
  lib/lifecycle.lua. Never more than `budget` units of work (one unit per
  node or child ref touched), so no call holds Redis for long; the host calls
  it again while it answers more = 1.

  KEYS[1] completed zset       P:{q}:completed (score: finished-at, ms)
  KEYS[2] dead zset            P:{q}:dead (score: finished-at, ms)

  ARGV[1] queue name
  ARGV[2] queue key prefix     P:{q}: (every key used is P:{q}:..., one slot)
  ARGV[3] now (ms)
  ARGV[4] budget: units of work this call may do (integer >= 1)
  ARGV[5] completed count: keep at most this many completed jobs
  ARGV[6] completed age (ms): drop completed jobs finished longer ago
  ARGV[7] dead count: keep at most this many dead jobs
  ARGV[8] dead age (ms): drop dead jobs finished longer ago
  ARGV[9] mode: 'all', or 'lists' to go on with queued cancels and removals
          only (what a remove / cancel call started), no retention
  ARGV[10] pass start (ms, optional, default now): a held row whose score is
          at or after it was held already in this pass (re-scored to a now of
          this pass); retention stops at it, and a call whose units all went
          on such rows answers more = 0

  returns: JSON {removed: n, held: n, more: 0|1 (1: cancels or removals
           are queued, or the budget ran out while rows were going: call
           again), sent: [outbox entries for other slots, as JSON
           texts], outbox, dead, released, flow_failed, revived}
  errors:  none
]]
local QUEUE = ARGV[1]
-- @include lib/flow.lua
-- @include lib/lifecycle.lua
local base, now = ARGV[2], tonumber(ARGV[3])
LEFT = tonumber(ARGV[4])
PASS = tonumber(ARGV[10] or ARGV[3])
REHELD = 0

cancel_run(base, now)
gc_run(base)
if ARGV[9] == 'all' then
  expire_run(base, now)
  if LEFT > 0 then
    keep_rule(base, 'completed', tonumber(ARGV[5]), tonumber(ARGV[6]), now)
  end
  if LEFT > 0 then
    keep_rule(base, 'dead', tonumber(ARGV[7]), tonumber(ARGV[8]), now)
  end
  gc_run(base)  -- the subtrees of the roots retention just dropped
end
OUT.removed = OUT.removed or 0
OUT.held = OUT.held or 0
-- more: work lists left, or the budget ran out while the call still got on
-- (rows went, child refs were drained, rows were held for the first time in
-- this pass and moved to the back): rows behind may still go. A call whose
-- units all went on rows held already in this pass stops: they wait for
-- their flows.
local lists = redis.call('EXISTS', base .. 'gc', base .. 'cancel')
local got_on = tonumber(ARGV[4]) - LEFT > REHELD
OUT.more = (lists > 0 or (LEFT <= 0 and got_on)) and 1 or 0
return cjson.encode(OUT)
