--[[
  extend_lease: heartbeat for a long job; push its lease deadline forward.
  docs/explanation/protocol.md#leases-and-recovery.

  KEYS[1] job row              P:{q}:job:<id>
  KEYS[2] active zset          P:{q}:active (score: lease deadline, ms)

  ARGV[1] queue name
  ARGV[2] job id
  ARGV[3] lease token (from claim)
  ARGV[4] now (ms)
  ARGV[5] lease length (ms), counted from now

  returns: the new deadline (ms)
  errors:  EMQNOJOB <queue> <id>            no such job
           EMQSTATE <queue> <id> <state>    the job is not active
           EMQLEASE <queue> <id>            the lease token is stale
           EMQCANCELLED <queue> <id>        the job was cancelled
                                            (docs/explanation/lifecycle.md#cancel): the lease is not extended
]]
local row, active = KEYS[1], KEYS[2]
local queue, id, token = ARGV[1], ARGV[2], ARGV[3]
local deadline = tonumber(ARGV[4]) + tonumber(ARGV[5])
-- @include lib/lease.lua
-- @include lib/row.lua

local f = row_hmget_s(row, F_STATE, 'lease', 'cancel')
local refused = lease_refused(queue, id, f[1], f[2], token)
if refused then
  return refused
end
if f[3] then
  return redis.error_reply('EMQCANCELLED ' .. queue .. ' ' .. id)
end
redis.call('ZADD', active, 'XX', deadline, id)
return deadline
