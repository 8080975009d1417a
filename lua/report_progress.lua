--[[
  report_progress: a running job's handler says how far it got
  (docs/explanation/protocol.md#progress-and-log-lines). One step, guarded by
  the job's lease as extend_lease is, and touching nothing extend_lease
  touches (the `active` zset): a progress write never races a heartbeat.
  The value replaces the row's `progress` field and is written to the
  queue's events stream as e=progress id=<id> p=<value> (lib/emit.lua, capped
  like every entry there).

  KEYS[1] job row              P:{q}:job:<id>
  KEYS[2] events stream        P:{q}:events

  ARGV[1] queue name
  ARGV[2] job id
  ARGV[3] lease token (from claim)
  ARGV[4] progress: a JSON text the host checked (a number 0-100 or a
          small object; at most protocol/live/progress.MAX_PROGRESS_BYTES
          bytes)

  returns: 1
  errors:  EMQNOJOB <queue> <id>            no such job
           EMQSTATE <queue> <id> <state>    the job is not active
           EMQLEASE <queue> <id>            the lease token is stale
]]
local row, events = KEYS[1], KEYS[2]
local queue, id, token, value = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
-- @include lib/emit.lua
-- @include lib/lease.lua

local f = redis.call('HMGET', row, 'state', 'lease')
local refused = lease_refused(queue, id, f[1], f[2], token)
if refused then
  return refused
end
redis.call('HSET', row, 'progress', value)
emit_to(events, 'progress', id, 'p', value)
return 1
