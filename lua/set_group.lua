--[[
  set_group: pause, resume or cap one group of a queue
  (docs/explanation/protocol.md#groups, lib/groups.lua). A paused group
  leaves the ring at once (its active jobs run on); a resumed one, or one
  whose cap changed, comes back to the ring when it has claimable jobs, and
  the queue's workers are woken (they blocked while it could give nothing).

  KEYS[1] paused groups        P:{q}:groups:paused (set)
  KEYS[2] group caps           P:{q}:groups:concurrency (hash: group -> jobs)

  ARGV[1] queue key prefix     P:{q}:
  ARGV[2] group name
  ARGV[3] 'pause', 'resume', 'cap' or 'rate'
  ARGV[4] with 'cap': the group's cap (jobs >= 1); with 'rate': its rate
          limit 'max:per_ms' (P:{q}:groups:rate); '' drops it (the
          GROUP_CONCURRENCY / GROUP_RATE_LIMIT setting applies again); ''
          otherwise

  returns: 1 when the state changed, 0 when it already was so
  errors:  none
]]
local paused, caps = KEYS[1], KEYS[2]
local base, group, op = ARGV[1], ARGV[2], ARGV[3]
-- @include lib/claimable.lua
local changed
if op == 'pause' then
  changed = redis.call('SADD', paused, group)
  redis.call('ZREM', base .. 'groups', group)
  return changed
end
if op == 'resume' then
  changed = redis.call('SREM', paused, group)
else
  local hash = (op == 'rate') and base .. 'groups:rate' or caps
  if ARGV[4] == '' then
    changed = redis.call('HDEL', hash, group)
  else
    changed = (redis.call('HGET', hash, group) == ARGV[4]) and 0 or 1
    redis.call('HSET', hash, group, ARGV[4])
  end
end
-- claim checks the cap and the window as it pops the group: back in the
-- ring at once
redis.call('SREM', base .. 'groups:capped', group)
redis.call('ZREM', base .. 'groups:limited', group)
if group_has_work(group_base(base, group)) and group_ready(base, group) then
  wake_workers(base)
end
return changed
