--[[
  update_payload: a running job's handler replaces its own payload (a step
  job, docs/explanation/protocol.md#step-jobs): the next attempt, or the run
  after its children resolved, reads the new one. Guarded by the job's lease
  as every write of a running job is (lib/lease.lua); no event (the job does
  not move).

  KEYS[1] job row              P:{q}:job:<id>

  ARGV[1] queue name
  ARGV[2] job id
  ARGV[3] lease token (from claim)
  ARGV[4] the new payload: JSON text the host checked (at most
          max_payload_bytes)
  ARGV[5] now (ms)

  returns: 1
  errors:  EMQNOJOB <queue> <id>            no such job
           EMQSTATE <queue> <id> <state>    the job is not active
           EMQLEASE <queue> <id>            the lease token is stale
]]
local row = KEYS[1]
local queue, id, token, payload, now = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
-- @include lib/lease.lua
-- @include lib/row.lua

local f = row_hmget_s(row, F_STATE, 'lease')
local refused = lease_refused(queue, id, f[1], f[2], token)
if refused then
  return refused
end
redis.call('HSET', row, F_DATA, payload, 'updated_at', now)
return 1
