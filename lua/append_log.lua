--[[
  append_log: a running job's handler appends one line to its job log
  (docs/explanation/protocol.md#progress-and-log-lines), guarded by the job's
  lease as report_progress is. The log keeps the newest `keep` lines (the
  queue's KEEP_LOGS): RPUSH then LTRIM, so it never holds more. The log is
  a part of the row (P:{q}:job:<id>:logs), removed with it on every road
  that deletes a row (lib/lifecycle.lua, lib/flow.lua, drop_unprocessed).

  KEYS[1] job row              P:{q}:job:<id>
  KEYS[2] job log              P:{q}:job:<id>:logs (list, oldest first)

  ARGV[1] queue name
  ARGV[2] job id
  ARGV[3] lease token (from claim)
  ARGV[4] lines kept (KEEP_LOGS, an integer >= 1)
  ARGV[5] the line (text the host cut to at most
          protocol/live/progress.MAX_LOG_LINE_BYTES bytes)

  returns: the number of lines the log held after this one was added,
           before the trim (so a caller can tell how many were dropped)
  errors:  EMQNOJOB <queue> <id>            no such job
           EMQSTATE <queue> <id> <state>    the job is not active
           EMQLEASE <queue> <id>            the lease token is stale
]]
local row, logs = KEYS[1], KEYS[2]
local queue, id, token = ARGV[1], ARGV[2], ARGV[3]
local keep = tonumber(ARGV[4])
-- @include lib/lease.lua

local f = redis.call('HMGET', row, 'state', 'lease')
local refused = lease_refused(queue, id, f[1], f[2], token)
if refused then
  return refused
end
local n = redis.call('RPUSH', logs, ARGV[5])
if n > keep then
  redis.call('LTRIM', logs, -keep, -1)
end
return n
