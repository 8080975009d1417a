--[[
  lock_outbox: take, renew or drop a pump's sweep lock on one queue's outbox
  (docs/explanation/reliability.md#a-pumps-lock-never-outlives-a-pump-for-long). The lock is a lease: a string holding its
  owner's token, always with an expiry (PX), never without one. Its owner
  recognises it by the token, so a pump whose drop failed while Redis was
  down (or whose lock came back from the AOF after a restart) takes it up
  again at its next sweep instead of being locked out by its own old lock;
  a lease of a few seconds, renewed while sweeping, lets a live peer take
  over soon after its owner died. A drop also leaves one mark on the
  unlocked list, which a caller waiting for the lock blocks on (BLPOP, in
  Lifecycle.deliver_sent; docs/explanation/no-polling.md: waits block, they do not poll): one
  element at most, kept UNLOCKED_TTL_MS, so a mark no waiter popped costs a
  later waiter one more try and never lingers.

  A worker's token starts with `w`: while it holds the lock, a push onto
  the outbox does not wake the pump (lib/claimable.lua push_outbox), so its
  drop wakes the pump when the outbox still holds entries (another worker's,
  or one it could not deliver). A pump's drop wakes nobody: what it left
  waits for its next sweep.

  KEYS[1] sweep lock           P:{q}:pump:lock (string: the holder's token)
  KEYS[2] unlocked list        P:{q}:pump:unlocked (list: one mark per drop, at most one kept)
  KEYS[3] outbox list          P:{q}:flow:outbox
  KEYS[4] pump wake marker     P:{q}:flow:wake (zset)

  ARGV[1] token: the pump's own, the same for every sweep of its life; a
          worker's starts with `w`
  ARGV[2] lease (ms, integer >= 1): how long the lock holds unless renewed
  ARGV[3] '1' take or renew; '0' drop

  returns: 1 when the caller holds the lock now (take) or held it (drop),
           0 when another token holds it (take) or it was not the caller's
           (drop: nothing is deleted, no mark is left)
  errors:  none
]]
-- @include lib/sweep_lock.lua

local UNLOCKED_TTL_MS = 1000 -- a mark serves a waiter between its refused take and its BLPOP
local lock, unlocked, token = KEYS[1], KEYS[2], ARGV[1]
if ARGV[3] == '0' then
  if redis.call('GET', lock) == token then
    redis.call('DEL', lock)
    -- DEL then RPUSH: one mark, whatever earlier drops left; a blocked
    -- waiter pops it as this script ends
    redis.call('DEL', unlocked)
    redis.call('RPUSH', unlocked, '1')
    redis.call('PEXPIRE', unlocked, UNLOCKED_TTL_MS)
    if token:sub(1, 1) == 'w' and redis.call('LLEN', KEYS[3]) > 0 then
      redis.call('ZADD', KEYS[4], 0, '0')  -- lib/claimable.lua WAKE_NOW
    end
    return 1
  end
  return 0
end
return take_sweep_lock(lock, token, ARGV[2]) and 1 or 0
