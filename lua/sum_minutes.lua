--[[
  sum_minutes: a queue's per-minute counters summed into columns of
  consecutive minutes, for the dashboard's longer ranges
  (docs/explanation/protocol.md#minute-counters). Read only: the ring is read
  whole here and summed, so a day answers as 60 columns of four counts
  instead of 7,200 fields over the wire.

  KEYS[1] minute ring          P:{q}:minutes

  ARGV[1] the first minute summed (minutes since the epoch)
  ARGV[2] minutes summed (1 to the ring's 1,440 slots)
  ARGV[3] minutes per column (at least 1)

  returns: a flat array of integers, four per column oldest first: the
           column's added, completed, failed and dead counts
  errors:  none (a ring nobody counted in sums to zeros)
]]
local first, count, per = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
for i = 1, 4 * math.ceil(count / per) do
  out[i] = 0
end
local flat = redis.call('HGETALL', KEYS[1])
local ring = {}
for i = 1, #flat, 2 do
  ring[flat[i]] = flat[i + 1]
end
local kinds = { 'a', 'c', 'f', 'd' }
for field, stamp in pairs(ring) do
  if string.sub(field, 1, 1) == 'm' then -- the minute its slot holds
    local offset = tonumber(stamp) - first
    if offset >= 0 and offset < count then
      local slot, at = string.sub(field, 2), 4 * math.floor(offset / per)
      for k = 1, 4 do
        local n = ring[kinds[k] .. slot]
        if n then
          out[at + k] = out[at + k] + tonumber(n)
        end
      end
    end
  end
end
return out
