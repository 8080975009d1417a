--[[
  set_paused: pause or resume a queue (docs/explanation/protocol.md#scheduling `emq.pause` /
  `emq.resume`). A paused queue is not claimed from (claim checks the flag);
  everything else (adds, completions, fan-in, the pump) goes on.

  KEYS[1] paused flag          P:{q}:paused (string: the ms it was paused at)
  KEYS[2] events stream        P:{q}:events

  ARGV[1] '1' pause, '0' resume
  ARGV[2] now (ms)
  ARGV[3] queue key prefix     P:{q}: (a resume wakes the queue's workers)

  returns: 1 when the state changed, 0 when it already was so
  errors:  none
]]
local flag, events = KEYS[1], KEYS[2]
-- @include lib/claimable.lua
-- @include lib/emit.lua
local changed
if ARGV[1] == '1' then
  changed = redis.call('SET', flag, ARGV[2], 'NX') and 1 or 0
else
  changed = redis.call('DEL', flag)
end
if changed == 1 then
  local e = (ARGV[1] == '1') and 'paused' or 'resumed'
  emit_to(events, e, '')
  if ARGV[1] ~= '1' then
    wake_workers(ARGV[3])  -- idle workers slept through the pause: claim now
  end
end
return changed
