--[[
  take_outbox: take (or renew) a pump's sweep lock on one queue's outbox and
  read the outbox's head in the same step, for the pump's delivery
  (docs/explanation/protocol.md#the-flow-outbox-and-the-pump): one round trip
  where a sweep took two (the lock, then LRANGE), on the path from a child's
  completion to its parent on another queue. Nothing is removed: the pump
  delivers what it read, then trim_outbox removes exactly that. Nothing is
  read unless the lock is the caller's, so no other pump trims what this
  one read until it drops the lock or its lease ends.

  KEYS[1] sweep lock           P:{q}:pump:lock (string: the holder's token)
  KEYS[2] outbox list          P:{q}:flow:outbox

  ARGV[1] token: the pump's own, the same for every sweep of its life
  ARGV[2] lease (ms, integer >= 1): how long the lock holds unless renewed
  ARGV[3] head (integer >= 1): how many entries to read from the head

  returns: {0} when another token holds the lock (nothing read);
           {2} when the outbox is empty: the lock is not taken (nor renewed,
           nor dropped), so a pump woken for entries a worker delivered
           itself does not hold the lock against that worker's next take;
           {1, length, entry, ...} when the caller holds it now: the
           outbox's length, then its first min(head, length) entries, raw
  errors:  none
]]
-- @include lib/sweep_lock.lua

local lock, outbox = KEYS[1], KEYS[2]
local length = redis.call('LLEN', outbox)
if length == 0 then
  return {2}
end
if not take_sweep_lock(lock, ARGV[1], ARGV[2]) then
  return {0}
end
local reply = redis.call('LRANGE', outbox, 0, tonumber(ARGV[3]) - 1)
table.insert(reply, 1, length)
table.insert(reply, 1, 1)
return reply
