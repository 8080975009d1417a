--[[
  trim_outbox: after a sweep delivered a batch, remove exactly the delivered
  prefix of the outbox, moving undeliverable entries to the dead-letter list
  on the way (docs/explanation/protocol.md#the-flow-outbox-and-the-pump); that list keeps only its newest ARGV[3] entries,
  trimmed in this same step (nothing else pushes to it). An entry whose
  parent was not found yet, to be tried again at a later sweep, goes to the
  back of the outbox instead, so it never holds up the entries behind it
  (they were delivered: trimmed now, not delivered again). It checks what it
  removes: the caller passes the entries it read, and the head of the outbox
  must still be exactly those, or nothing moves. So a replay of this script
  (redis-py re-sends a command whose reply was lost) or a second pump can
  never trim an entry nobody delivered; the sweep lock must also still be
  the caller's. The failed-delivery counts (KEYS[4]) of the entries leaving
  for good go with them, and the whole hash once the outbox is empty, so it
  never holds more than the outbox does.

  KEYS[1] outbox list          P:{q}:flow:outbox
  KEYS[2] sweep lock           P:{q}:pump:lock (string: the holder's token)
  KEYS[3] dead-letter list     P:{q}:flow:deadletter (newest last)
  KEYS[4] delivery counts      P:{q}:flow:tries (hash: entry -> failed deliveries)

  ARGV[1] lock token
  ARGV[2] now (ms)
  ARGV[3] dead-letter cap: the newest this many entries are kept (>= 1)
  ARGV[4..] pairs, one per entry from the head, in order: the entry exactly
           as read, then 'ok' (delivered: remove), 'again' (parent not found
           yet: move to the back of the outbox) or a reason text
           (undeliverable: move to the dead-letter list as JSON
           {entry, reason, at})

  returns: the number of entries removed from the head of the outbox (0 when
           the head is no longer what the caller read: another pump, or a
           replay, trimmed it)
  errors:  EMQLOCK <lock key>   the lock is not held by this token; nothing moves
]]
-- @include lib/cancel_out.lua

local outbox, lock, deadletter, tries = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local base = outbox:sub(1, -#'flow:outbox' - 1)
if redis.call('GET', lock) ~= ARGV[1] then
  return redis.error_reply('EMQLOCK ' .. lock)
end
local cap = tonumber(ARGV[3])
local n = (#ARGV - 3) / 2
if n < 1 then
  return 0
end
local head = redis.call('LRANGE', outbox, 0, n - 1)
if #head ~= n then
  return 0
end
for i = 1, n do
  if head[i] ~= ARGV[2 + 2 * i] then
    return 0
  end
end
local lettered, again, counted = 0, {}, redis.call('EXISTS', tries) == 1
for i = 1, n do
  local entry, action = head[i], ARGV[3 + 2 * i]
  if action == 'again' then
    again[#again + 1] = entry
  else
    outbox_entry_left(base, entry)
    if action ~= 'ok' then
      redis.call('RPUSH', deadletter,
        cjson.encode({entry = entry, reason = action, at = tonumber(ARGV[2])}))
      lettered = lettered + 1
    end
    if counted then
      redis.call('HDEL', tries, entry)
    end
  end
end
if lettered > 0 then
  redis.call('LTRIM', deadletter, -cap, -1)  -- a flood of poison entries stays bounded
end
redis.call('LTRIM', outbox, n, -1)
if #again > 0 then
  redis.call('RPUSH', outbox, unpack(again))
elseif counted and redis.call('EXISTS', outbox) == 0 then
  redis.call('DEL', tries)  -- counts of entries taken out elsewhere (a retry's LREM)
end
return n
