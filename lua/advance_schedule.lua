--[[
  advance_schedule: record that a periodic job's tick was enqueued
  (docs/howto/periodic.md#how-it-fires). The mark only moves forward, so two schedulers that
  fire the same tick agree, and a restart knows which tick came last.

  KEYS[1] schedule mark        P:{q}:schedule:<entry> (string: last tick, ms)

  ARGV[1] tick (ms since the epoch)
  ARGV[2] mode: 'fire' moves the mark to the tick when it is later; 'init'
          sets it only when there is none (a first start fires no past tick)

  returns: the mark after the call (ms)
  errors:  none
]]
local mark = KEYS[1]
local tick = tonumber(ARGV[1])
local last = tonumber(redis.call('GET', mark) or '-1')
if last < 0 or (ARGV[2] == 'fire' and tick > last) then
  redis.call('SET', mark, ARGV[1])
  return tick
end
return last
