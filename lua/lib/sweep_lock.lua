--[[
  lib/sweep_lock.lua: take or renew a pump's sweep lock on one queue's
  outbox (docs/explanation/reliability.md#a-pumps-lock-never-outlives-a-pump-for-long):
  a string holding its owner's token, always with an expiry (PX). A lock
  already holding the caller's token is the caller's own (left by a drop
  that failed while Redis was away), renewed, not waited out. Inlined by the
  script loader where `@include lib/sweep_lock.lua` appears (lock_outbox.lua,
  take_outbox.lua). Local definitions only.
]]

-- true when `token` holds `lock` now (taken, or renewed for `lease_ms`),
-- false when another token holds it (nothing changes)
local function take_sweep_lock(lock, token, lease_ms)
  local holder = redis.call('GET', lock)
  if holder == token then
    redis.call('PEXPIRE', lock, lease_ms)
    return true
  end
  if holder then
    return false
  end
  redis.call('SET', lock, token, 'PX', lease_ms)
  return true
end
