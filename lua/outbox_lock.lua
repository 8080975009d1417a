--[[
  outbox_lock: take, renew or drop a pump's sweep lock on one queue's outbox
  (DESIGN §6; issue 17, item 2). The lock is a lease: a string holding its
  owner's token, always with an expiry (PX), never without one. Its owner
  recognises it by the token, so a pump whose drop failed while Redis was
  down (or whose lock came back from the AOF after a restart) takes it up
  again at its next sweep instead of being locked out by its own old lock;
  a lease of a few seconds, renewed while sweeping, lets a live peer take
  over soon after its owner died.

  KEYS[1] sweep lock           P:{q}:pump:lock (string: the holder's token)

  ARGV[1] token: the pump's own, the same for every sweep of its life
  ARGV[2] lease (ms, integer >= 1): how long the lock holds unless renewed
  ARGV[3] '1' take or renew; '0' drop

  returns: 1 when the caller holds the lock now (take) or held it (drop),
           0 when another token holds it (take) or it was not the caller's
           (drop: nothing is deleted)
  errors:  none
]]
local lock, token = KEYS[1], ARGV[1]
local holder = redis.call('GET', lock)
if ARGV[3] == '0' then
  if holder == token then
    redis.call('DEL', lock)
    return 1
  end
  return 0
end
if holder == token then
  redis.call('PEXPIRE', lock, ARGV[2])
  return 1
end
if holder then
  return 0
end
redis.call('SET', lock, token, 'PX', ARGV[2])
return 1
