--[[
  lib/groups.lua: groups (tenants) inside a queue, claimed in turn
  (docs/explanation/protocol.md#groups). Inlined by lib/claimable.lua, which
  routes every job whose row names a `group` here; a queue whose jobs name
  none never reaches this file (no key, no command).

  A group g of queue q keeps its claimable ids under its own base
  P:{q}:g:<g>: (the same shapes as the queue's: a `pending` list for
  priority 0, a `prioritized` zset and its `pri:seq` otherwise), and the
  queue keeps, all on its own slot:

    P:{q}:groups              zset  the ring: groups that may give a job,
                                    group -> turn (claim pops the lowest,
                                    puts it back with a new turn at the end)
    P:{q}:groups:seq          counter the turns
    P:{q}:groups:pending      counter claimable ids in all groups (counts)
    P:{q}:groups:active       hash  group -> its jobs active now (a field
                                    goes at 0)
    P:{q}:groups:known        set   groups with claimable or active jobs
                                    (stats; a member goes with its last job)
    P:{q}:groups:capped       set   groups claim left out of the ring at
                                    their cap, with jobs waiting
    P:{q}:groups:limited      zset  groups whose rate window is full, with
                                    jobs waiting -> when it opens (ms)
    P:{q}:groups:paused       set   paused groups (emq.pause_group)
    P:{q}:groups:concurrency  hash  group -> its cap set at run time
    P:{q}:groups:rate         hash  group -> its rate limit set at run time,
                                    'max:per_ms'

  and per group with a rate limit P:{q}:g:<g>:limiter, a fixed window
  {start, n} (as the queue's RATE_LIMIT in fixed mode), expiring as it
  closes. A group whose window is full leaves the ring for groups:limited
  and its opening is announced as the queue's 'd' wake marker: the worker
  that pops it promotes at that time (lua/promote_delayed.lua), which puts
  the due groups back (release_limited); a claim does the same first.

  A group is in the ring while it may give a job: it has claimable jobs, is
  not paused, and (as last seen by claim) is under its cap. One left out at
  its cap (marked in groups:capped) comes back when one of its jobs leaves
  active (group_left), a paused one when it is resumed (lua/set_group.lua).
  Per job, claim spends about five commands on its group and a job leaving
  active two, five when it was its group's last active one
  (docs/explanation/performance.md#groups). So every key of a group with no
  jobs is gone, and memory is bounded by the groups with work (the
  paused set and the cap hash hold what the operator set).
]]

local function group_base(base, group)
  return base .. 'g:' .. group .. ':'
end

local function group_has_work(gb)
  return redis.call('EXISTS', gb .. 'pending', gb .. 'prioritized') > 0
end

-- Put `group` in the ring unless it is paused; its turn is kept when it is
-- in already. Returns true when it was added (the caller wakes a worker).
local function group_ready(base, group)
  if redis.call('SISMEMBER', base .. 'groups:paused', group) == 1 then
    return false
  end
  local turn = redis.call('INCR', base .. 'groups:seq')
  return redis.call('ZADD', base .. 'groups', 'NX', turn, group) == 1
end

-- A group with no claimable job left: its keys go (and its stats entry once
-- nothing of it is active either).
local function group_emptied(base, group, gb)
  redis.call('ZREM', base .. 'groups', group)
  redis.call('SREM', base .. 'groups:capped', group)
  redis.call('ZREM', base .. 'groups:limited', group)
  redis.call('DEL', gb .. 'pri:seq')
  if redis.call('HEXISTS', base .. 'groups:active', group) == 0 then
    redis.call('SREM', base .. 'groups:known', group)
  end
end

-- Push claimable `id` (priority `p`, a number) into its group; `front`: ahead
-- of its priority (a released parent). The caller then calls groups_pushed
-- once for the groups it pushed to.
local function group_push(base, group, id, p, front)
  local gb = group_base(base, group)
  if p ~= 0 then
    push_prioritized(gb, id, p, front)
  elseif front then
    redis.call('LPUSH', gb .. 'pending', id)
  else
    redis.call('RPUSH', gb .. 'pending', id)
  end
end

-- After `n` group_push calls to the groups `pushed` (a set: group -> true):
-- counted, known to the stats, each in the ring unless paused, capped or
-- rate limited. True when one of them can give a job now (wake a worker).
local function groups_pushed(base, pushed, n)
  redis.call('INCRBY', base .. 'groups:pending', n)
  local ready = false
  for group in pairs(pushed) do
    redis.call('SADD', base .. 'groups:known', group)
    if redis.call('SISMEMBER', base .. 'groups:capped', group) == 0
        and not redis.call('ZSCORE', base .. 'groups:limited', group) then
      group_ready(base, group)
      ready = ready or redis.call('ZSCORE', base .. 'groups', group) ~= false
    end
  end
  return ready
end

-- Take `id` out of its group's claimable ids (removed or killed while pending).
local function group_unclaimable(base, group, id)
  local gb = group_base(base, group)
  if redis.call('LREM', gb .. 'pending', 1, id) + redis.call('ZREM', gb .. 'prioritized', id) > 0 then
    redis.call('DECR', base .. 'groups:pending')
  end
  if not group_has_work(gb) then
    group_emptied(base, group, gb)
  end
end

-- One of the group's jobs left active: one fewer counts against its cap, and
-- a group claim left out at its cap gets its turn back (a worker is woken).
local function group_left(base, group)
  local acts = base .. 'groups:active'
  if redis.call('HINCRBY', acts, group, -1) <= 0 then
    redis.call('HDEL', acts, group)
    if not group_has_work(group_base(base, group)) then
      redis.call('SREM', base .. 'groups:known', group)
    end
  end
  if redis.call('SREM', base .. 'groups:capped', group) == 1 and group_ready(base, group) then
    redis.call('ZADD', base .. 'wake', 0, '0')  -- lib/claimable.lua WAKE_NOW
  end
end

-- Groups whose rate window opened by `now` (ms) go back to the ring; the
-- next opening is announced as the 'd' wake marker. Returns how many went.
local function release_limited(base, now)
  local limited = base .. 'groups:limited'
  local head = redis.call('ZRANGE', limited, 0, 0, 'WITHSCORES')
  if #head == 0 or tonumber(head[2]) > tonumber(now) then
    return 0  -- nothing due (a queue without groups: this one read)
  end
  local due = redis.call('ZRANGEBYSCORE', limited, '-inf', now, 'LIMIT', 0, 1000)
  for _, g in ipairs(due) do
    redis.call('ZREM', limited, g)
    group_ready(base, g)
  end
  local nxt = redis.call('ZRANGE', limited, 0, 0, 'WITHSCORES')[2]
  if nxt then
    redis.call('ZADD', base .. 'wake', 'LT', nxt, 'd')  -- lib/claimable.lua WAKE_DUE
  end
  return #due
end

-- A group's rate window: `rate` 'max:per_ms' (or false / ''), read at `now`
-- (ms). Returns max, per, start, used (max nil: no limit).
local function group_window(gb, rate, now)
  if not rate or rate == '' then
    return nil
  end
  local max, per = rate:match('^(%d+):(%d+)$')
  max, per = tonumber(max), tonumber(per)
  local w = redis.call('HMGET', gb .. 'limiter', 'start', 'n')
  local start, used = tonumber(w[1] or '0'), tonumber(w[2] or '0')
  if now >= start + per then
    start, used = now, 0
  end
  return max, per, start, used
end

-- Out of the ring until its window opens at `at` (ms), announced.
local function group_limited(base, group, at)
  redis.call('ZADD', base .. 'groups:limited', at, group)
  redis.call('ZADD', base .. 'wake', 'LT', at, 'd')  -- lib/claimable.lua WAKE_DUE
end

-- The group's next id: priorities > 0, its list, priorities < 0 (the
-- queue's order, lib/claimable.lua), or false.
local function group_pop_one(gb)
  local z = gb .. 'prioritized'
  if redis.call('EXISTS', z) == 0 then
    return redis.call('LPOP', gb .. 'pending')
  end
  local top = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
  if tonumber(top[2]) >= 0 then
    local id = redis.call('LPOP', gb .. 'pending')
    if id then
      return id
    end
  end
  redis.call('ZREM', z, top[1])
  return top[1]
end

-- Pop up to `n` ids from the groups in turn, one per group per turn: a group
-- given a job goes back at the end of the ring while it has more, is under
-- its cap (`cap`: GROUP_CONCURRENCY, '0' = none; P:{q}:groups:concurrency
-- wins) and its rate window has room (`rate`: GROUP_RATE_LIMIT 'max:per_ms',
-- '' = none; P:{q}:groups:rate wins) at `now` (ms). Each id taken counts as
-- active for its group at once (claim gives the count back through
-- left_active when the job is not leased).
local function pop_groups(base, n, cap, rate, now)
  local ring, acts, caps = base .. 'groups', base .. 'groups:active', base .. 'groups:concurrency'
  local own = redis.call('EXISTS', caps) == 1  -- a group's own cap is set somewhere
  local rates = base .. 'groups:rate'
  local own_rate = redis.call('EXISTS', rates) == 1
  release_limited(base, now)
  local out = {}
  while #out < n do
    local turn = redis.call('ZPOPMIN', ring, n - #out)
    if #turn == 0 then
      break
    end
    local back = {}
    for i = 1, #turn, 2 do
      local g = turn[i]
      local gb = group_base(base, g)
      local c = tonumber(own and redis.call('HGET', caps, g) or cap)
      local act = (c > 0) and tonumber(redis.call('HGET', acts, g) or '0') or 0
      local max, per, start, used = group_window(gb, own_rate and redis.call('HGET', rates, g)
        or rate, now)
      if max and used >= max then
        group_limited(base, g, start + per)
      elseif c == 0 or act < c then
        local id = group_pop_one(gb)
        if id then
          out[#out + 1] = id
          act = redis.call('HINCRBY', acts, g, 1)
          if max then
            used = used + 1
            redis.call('HSET', gb .. 'limiter', 'start', start, 'n', used)
            -- relative: the window is on the host's clock, not Redis's
            redis.call('PEXPIRE', gb .. 'limiter', math.max(1, start + per - now))
          end
        end
        if not group_has_work(gb) then
          group_emptied(base, g, gb)
        elseif max and used >= max then
          group_limited(base, g, start + per)
        elseif c == 0 or act < c then
          back[#back + 1] = g
        else
          redis.call('SADD', base .. 'groups:capped', g)
        end
      else
        -- at its cap: out of the ring until one of its jobs leaves active
        redis.call('SADD', base .. 'groups:capped', g)
      end
    end
    if #back > 0 then  -- back at the end of the ring, in the order they came
      local last = redis.call('INCRBY', base .. 'groups:seq', #back)
      local turns = {}
      for j, g in ipairs(back) do
        turns[#turns + 1] = last - #back + j
        turns[#turns + 1] = g
      end
      redis.call('ZADD', ring, unpack(turns))
    end
  end
  if #out > 0 then
    redis.call('DECRBY', base .. 'groups:pending', #out)
  end
  return out
end
