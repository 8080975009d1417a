--[[
  job_logs: read a job log (docs/explanation/protocol.md#progress-and-log-lines):
  its lines `start` .. `end`, inclusive, as LRANGE counts them (from 0, the
  oldest; a negative index counts from the newest, -1 the newest). The log
  is the row's field `lg` (its oldest line) followed by the list
  P:{q}:job:<id>:logs (the other lines, absent while there are none), or,
  without `lg`, the list alone (an empty log, or one whose oldest line is
  longer than a row keeps: lib/reports.lua write_lines): one read of both,
  the row's existence checked in the same step. Writes nothing.

  KEYS[1] job row              P:{q}:job:<id>
  KEYS[2] the job log's list   P:{q}:job:<id>:logs

  ARGV[1] queue name
  ARGV[2] job id
  ARGV[3] start (an integer, as LRANGE's)
  ARGV[4] end (an integer, as LRANGE's)

  returns: the lines, oldest first (an empty array when the range holds none)
  errors:  EMQNOJOB <queue> <id>            no such job
]]
local row, logs = KEYS[1], KEYS[2]
local start, stop = tonumber(ARGV[3]), tonumber(ARGV[4])

local oldest = redis.call('HGET', row, 'lg')
if not oldest then  -- the list alone: its own range (an index clamped to
  -- +-1e9, a number Lua writes as an integer, reads the same: a log holds
  -- at most 10,000 lines)
  local lines = redis.call('LRANGE', logs, math.max(math.min(start, 1e9), -1e9),
    math.max(math.min(stop, 1e9), -1e9))
  if #lines == 0 and redis.call('EXISTS', row) == 0 then
    return redis.error_reply('EMQNOJOB ' .. ARGV[1] .. ' ' .. ARGV[2])
  end
  return lines
end
local n = 1 + redis.call('LLEN', logs)
if start < 0 then
  start = math.max(n + start, 0)
end
if stop < 0 then
  stop = n + stop
end
stop = math.min(stop, n - 1)
if start > stop then
  return {}
end
if start > 0 then  -- the list alone: its index is one less
  return redis.call('LRANGE', logs, start - 1, stop - 1)
end
local out = {oldest}
if stop > 0 then
  for _, line in ipairs(redis.call('LRANGE', logs, 0, stop - 1)) do
    out[#out + 1] = line
  end
end
return out
