--[[
  wait_mark: a waiter's start (docs/explanation/protocol.md#waiting-for-a-result):
  the point in the job's done stream to block from, and the job's state, read
  at one time. A stream that exists already (another waiter made it) is left
  as it is and its last entry's id answered, so waiters already blocked on it
  do not wake for this one; a missing stream is made with a `wait` mark, so
  the script that finishes the job finds it (`EXISTS`) and notes the finish.
  The stream's expiry becomes the longer of its own and this wait's.

  KEYS[1] done stream          P:{q}:done:<id>
  KEYS[2] job row              P:{q}:job:<id>

  ARGV[1] expiry (ms): this wait's timeout plus a slack, an hour at most
  ARGV[2] the stream's length bound (entries, approximate)

  returns: [id, state]: the stream id to read after, and the row's state
           (lib/row.lua row_hmget_s: by either name, 'pending' for a row
           added as pending; nil: no such row)
  errors:  none of its own (a Redis before 7.0 refuses PEXPIRE NX / GT)
]]
local done, row = KEYS[1], KEYS[2]
-- @include lib/row.lua

local last = redis.call('XREVRANGE', done, '+', '-', 'COUNT', 1)[1]
local id
if last then
  id = last[1]
else
  id = redis.call('XADD', done, 'MAXLEN', '~', ARGV[2], '*', 'e', 'wait')
end
redis.call('PEXPIRE', done, ARGV[1], 'NX')  -- a new stream: this wait's expiry
redis.call('PEXPIRE', done, ARGV[1], 'GT')  -- another waiter's: the longer one
-- the state by either name, 'pending' for a row added as pending (lib/row.lua)
return {id, row_hmget_s(row, F_STATE)[1]}
