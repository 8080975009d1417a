--[[
  extend_lease: the heartbeat; push the lease deadline of one or many active
  jobs of one queue forward, each checked as if alone (a refused job writes
  nothing and does not stop the others). One call for a worker's whole
  batch of held jobs: a heartbeat is one round trip per queue, whatever the
  number of jobs it holds. docs/explanation/protocol.md#leases-and-recovery.

  KEYS[1] active zset          P:{q}:active (score: lease deadline, ms)

  ARGV[1] queue name
  ARGV[2] queue key prefix     P:{q}: (job rows are P:{q}:job:<id>, same slot)
  ARGV[3] now (ms)
  ARGV[4] lease length (ms), counted from now
  ARGV[5] the jobs, 2 values each, joined by the byte 0x1F (as complete's
          ARGV[6]): job id, lease token (from claim, '' for none)

  returns: an array with one entry per job, in order: the new deadline (ms,
           an integer), or the refusal's text (nothing written for it):
             EMQNOJOB <queue> <id>            no such job
             EMQSTATE <queue> <id> <state>    the job is not active
             EMQLEASE <queue> <id>            the lease token is stale
             EMQCANCELLED <queue> <id>        the job was cancelled
                                              (docs/explanation/lifecycle.md#cancel)
  errors:  none: a refusal is its job's entry in the reply
]]
local active, queue, base = KEYS[1], ARGV[1], ARGV[2]
local deadline = tonumber(ARGV[3]) + tonumber(ARGV[4])  -- the reply's (an integer)
local at = string.format('%d', deadline)  -- ZADD's, as text once (not formatted per job)
-- @include lib/lease.lua
-- @include lib/row.lua

local J = split_joined(ARGV[5])

local replies, moved = {}, {}
for i = 1, #J - 1, 2 do
  local id, token = J[i], J[i + 1]
  local f = row_hmget_s(base .. 'job:' .. id, F_STATE, 'lease', 'cancel')
  local refused = lease_refused(queue, id, f[1], f[2], token)
  if refused then
    replies[#replies + 1] = refused.err
  elseif f[3] then
    replies[#replies + 1] = 'EMQCANCELLED ' .. queue .. ' ' .. id
  else
    replies[#replies + 1] = deadline
    moved[#moved + 1] = at
    moved[#moved + 1] = id
  end
end
if #moved > 0 then
  redis.call('ZADD', active, 'XX', unpack(moved))
end
return replies
