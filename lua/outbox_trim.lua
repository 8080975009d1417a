--[[
  outbox_trim: after a sweep delivered a batch, remove exactly the delivered
  prefix of the outbox, moving undeliverable entries to the dead-letter list
  on the way (DESIGN §6). Refuses unless the caller still holds the sweep
  lock, so two pumps never trim what the other has not delivered.

  KEYS[1] outbox list          P:{q}:flow:outbox
  KEYS[2] sweep lock           P:{q}:pump:lock (string: the holder's token)
  KEYS[3] dead-letter list     P:{q}:flow:deadletter

  ARGV[1] lock token
  ARGV[2] now (ms)
  ARGV[3..] one action per entry from the head, in order: 'ok' (delivered:
           remove) or a reason text (undeliverable: move to the dead-letter
           list as JSON {entry, reason, at})

  returns: the number of entries removed from the outbox
  errors:  EMQLOCK <lock key>   the lock is not held by this token; nothing moves
]]
local outbox, lock, deadletter = KEYS[1], KEYS[2], KEYS[3]
if redis.call('GET', lock) ~= ARGV[1] then
  return redis.error_reply('EMQLOCK ' .. lock)
end
local n = #ARGV - 2
if n == 0 then
  return 0
end
local entries = redis.call('LRANGE', outbox, 0, n - 1)
for i = 1, #entries do
  local action = ARGV[i + 2]
  if action ~= 'ok' then
    redis.call('RPUSH', deadletter,
      cjson.encode({entry = entries[i], reason = action, at = tonumber(ARGV[2])}))
  end
end
redis.call('LTRIM', outbox, #entries, -1)
return #entries
