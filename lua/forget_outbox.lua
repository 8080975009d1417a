--[[
  forget_outbox: take out of this queue's outbox the entries its caller has
  just delivered itself (docs/explanation/protocol.md#the-flow-outbox-and-the-pump). remove, cancel, retry and prune
  push entries for other slots and deliver them at once; left in the outbox,
  the pump would deliver them a second time, and a second delivery is not a
  no-op when something changed in between (the flow was added again under
  the same ids, a cancelled parent was retried). The caller holds the
  outbox's sweep lock, so no pump has read these entries and is about to
  trim them. Each entry goes once, searched from the tail, where it was
  just pushed.

  KEYS[1] outbox list          P:{q}:flow:outbox
  KEYS[2] sweep lock           P:{q}:pump:lock (string: the holder's token)

  ARGV[1] lock token (the caller's)
  ARGV[2..] the entries, exactly as pushed

  returns: the number of entries taken out (an entry not found was taken
           already: a replay of this call)
  errors:  EMQLOCK <lock key>   the lock is not held by this token; nothing moves
]]
-- @include lib/cancel_out.lua

local outbox, lock = KEYS[1], KEYS[2]
if redis.call('GET', lock) ~= ARGV[1] then
  return redis.error_reply('EMQLOCK ' .. lock)
end
local base = outbox:sub(1, -#'flow:outbox' - 1)
local n = 0
for i = 2, #ARGV do
  local gone = redis.call('LREM', outbox, -1, ARGV[i])
  if gone > 0 then
    outbox_entry_left(base, ARGV[i])
  end
  n = n + gone
end
return n
