--[[
  lib/claimable.lua: the one place a job becomes claimable, and the wake-ups
  that let workers and pumps block instead of poll (docs/explanation/no-polling.md). Inlined by
  the script loader into every script whose header says
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

  A queue with a concurrency cap (docs/explanation/protocol.md#concurrency)
  that `claim` found full while jobs were claimable has its full mark
  P:{q}:full (a string): its '0' marker is removed, so idle workers block,
  and every path that takes a job out of P:{q}:active calls left_active,
  which drops the mark and puts '0' back: a job leaving wakes a worker.

  Every road to claimable goes through make_claimable (enqueue, enqueue_flow,
  a parent's release, promotion, recovery, retry, fail without backoff,
  flow delivery): a change to how pending is kept (priorities, pause, the
  ranges of a flow's serial ids: lib/pending.lua) changes this one function.
]]

local WAKE_NOW, WAKE_DUE = '0', 'd'

-- Tell the queue's idle workers that a job is claimable.
local function wake_workers(base)
  redis.call('ZADD', base .. 'wake', 0, WAKE_NOW)
end

-- Priorities (docs/explanation/protocol.md#scheduling): priority 0, the default, keeps the pending
-- list; any other priority goes to the zset P:{q}:prioritized, scored
--   -priority * 2^32 + offset
-- so a higher priority has a lower score. Within a priority, `offset` is
-- +n for a push at the back and -n for a push at the front (a released
-- parent), n from the counter P:{q}:pri:seq (reset when the zset empties;
-- |offset| < 2^31, |priority| <= 10^6: every score is an exact double).
-- claim takes priorities > 0 (scores < 0), then the list, then priorities < 0.
local PRI_BAND = 4294967296

local function push_prioritized(base, id, priority, front)
  local z = base .. 'prioritized'
  if redis.call('EXISTS', z) == 0 then
    redis.call('DEL', base .. 'pri:seq')
  end
  local n = redis.call('INCR', base .. 'pri:seq')
  redis.call('ZADD', z, -priority * PRI_BAND + (front and -n or n), id)
end

-- @include lib/groups.lua
-- @include lib/pending.lua

-- A job left P:{q}:active (completed, failed, postponed, recovered, killed):
-- when claim found the queue full, wake its workers: there is room again.
-- One DEL per call; nothing is written on a queue that was not full.
-- `group`: the job's group (its row's), nil for none (lib/groups.lua).
local full_cleared = {}  -- queues whose full mark this script call cleared already
local function left_active(base, group)
  if group then
    group_left(base, group)
  end
  -- once per call and queue: only a claim sets the mark, and none runs
  -- inside this script (complete's batch: one DEL, not one per job)
  if not full_cleared[base] then
    full_cleared[base] = true
    if redis.call('DEL', base .. 'full') == 1 then
      wake_workers(base)
    end
  end
end

-- Make `ids` claimable (a list, in order; the caller already wrote their rows
-- as pending) and wake the queue's workers once. `prios`: nil (all priority
-- 0), one number for all, or a list parallel to `ids` (nil or '0' = 0);
-- `front`: ahead of the jobs of the same priority (a released parent);
-- `groups`: nil (none), one group for all, or a list parallel to `ids` (nil
-- = none): a grouped id goes to its group (lib/groups.lua).
local function make_claimable(base, ids, prios, front, groups)
  local n = #ids
  if n == 0 then
    return
  end
  local plain, pushed, grouped = ids, nil, 0
  if prios ~= nil or front or groups ~= nil then
    plain = {}
    for i, id in ipairs(ids) do
      local p = tonumber((type(prios) == 'table' and prios[i]) or prios or 0) or 0
      local g = groups
      if type(groups) == 'table' then
        g = groups[i]
      end
      if g then
        group_push(base, g, id, p, front)
        pushed = pushed or {}
        pushed[g] = true
        grouped = grouped + 1
      elseif p ~= 0 then
        push_prioritized(base, id, p, front)
      elseif front then
        redis.call('LPUSH', base .. 'pending', id)
      else
        plain[#plain + 1] = id
      end
    end
    n = #plain
  end
  if pushed and not groups_pushed(base, pushed, grouped) and grouped == #ids then
    return  -- every group it went to is paused, capped or rate limited: no wake-up
  end
  pending_push(base, plain, n)  -- runs of a flow's serial ids as ranges (lib/pending.lua)
  wake_workers(base)
end

-- Make one job claimable again (retried, re-run, failed without backoff),
-- its priority and group read from its row: one read, as before groups.
local function make_claimable_row(base, id)
  local f = redis.call('HMGET', base .. 'job:' .. id, 'priority', 'group')
  make_claimable(base, {id}, f[1], false, f[2] or nil)
end

-- Take `id` out of the claimable structures (a pending job removed or
-- killed); `group`: its row's group, nil for none.
local function unclaimable(base, id, group)
  if group then
    return group_unclaimable(base, group, id)
  end
  if redis.call('LREM', base .. 'pending', 1, id) == 0
      and redis.call('ZREM', base .. 'prioritized', id) == 0 then
    pending_unrange(base, id)  -- inside a range of the list (lib/pending.lua)
  end
end

-- Schedule `id` (its row already says delayed) to become claimable at
-- `run_at` (ms), and announce the time: a worker blocked on the queue learns
-- it, and promotes the job when it is due (LT keeps the earliest announced).
local function make_delayed(base, id, run_at)
  redis.call('ZADD', base .. 'delayed', run_at, id)
  redis.call('ZADD', base .. 'wake', 'LT', run_at, WAKE_DUE)
end

-- Append a fan-in entry (JSON text) to the queue's outbox and wake its pump,
-- unless a worker holds the outbox's sweep lock (a token starting with `w`:
-- it delivers what its own completions push, and wakes the pump as it drops
-- the lock with entries left: lock_outbox.lua); a lock that runs out instead
-- leaves what it held to the pump's interval sweep.
local function push_outbox(base, entry)
  redis.call('RPUSH', base .. 'flow:outbox', entry)
  local holder = redis.call('GET', base .. 'pump:lock')
  if not holder or holder:sub(1, 1) ~= 'w' then
    redis.call('ZADD', base .. 'flow:wake', 0, WAKE_NOW)
  end
end
