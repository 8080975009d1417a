--[[
  lib/claimable.lua: the one place a job becomes claimable, and the wake-ups
  that let workers and pumps block instead of poll (DESIGN §10.1). Inlined by
  the registry into every script whose header says
  `@include lib/claimable.lua` (lib/flow.lua includes it too). It defines
  local functions only and touches no key until a script calls them; every
  key it builds is `base .. suffix` on the calling script's own slot.

  The wake keys are sorted sets with a fixed set of members, so they never
  grow with traffic (at most two members each):

    P:{q}:wake       '0' score 0     a job is claimable: an idle worker
                                     BZPOPMINs it, then claims
                     'd' score run-at (ms) the earliest delayed run-at the
                                     queue announced: the worker that pops
                                     it promotes at that time
    P:{q}:flow:wake  '0' score 0     the outbox has entries: a pump BZPOPMINs
                                     it, then delivers

  A popped marker is consumed: `claim` puts '0' back while jobs are left
  pending (the next idle worker wakes too) and removes it once it drained
  pending, so '0' is there exactly while something is claimable and no
  worker has been told.

  Every road to claimable goes through make_claimable (enqueue, enqueue_flow,
  a parent's release, promotion, recovery, retry, fail without backoff,
  flow delivery): a change to how pending is kept (priorities, pause) changes
  this one function.
]]

local WAKE_NOW, WAKE_DUE = '0', 'd'

-- Tell the queue's idle workers that a job is claimable.
local function wake_workers(base)
  redis.call('ZADD', base .. 'wake', 0, WAKE_NOW)
end

-- Push `ids` (a list, in order; the caller already wrote their rows as
-- pending) onto the queue's pending list and wake its workers once.
local function make_claimable(base, ids)
  local n = #ids
  if n == 0 then
    return
  end
  for i = 1, n, 1000 do  -- unpack() has a stack limit: push by the thousand
    redis.call('RPUSH', base .. 'pending', unpack(ids, i, math.min(i + 999, n)))
  end
  wake_workers(base)
end

-- Schedule `id` (its row already says delayed) to become claimable at
-- `run_at` (ms), and announce the time: a worker blocked on the queue learns
-- it, and promotes the job when it is due (LT keeps the earliest announced).
local function make_delayed(base, id, run_at)
  redis.call('ZADD', base .. 'delayed', run_at, id)
  redis.call('ZADD', base .. 'wake', 'LT', run_at, WAKE_DUE)
end

-- Append a fan-in entry (JSON text) to the queue's outbox and wake its pump.
local function push_outbox(base, entry)
  redis.call('RPUSH', base .. 'flow:outbox', entry)
  redis.call('ZADD', base .. 'flow:wake', 0, WAKE_NOW)
end
