--[[
  expire_children: held parents whose children_timeout_ms has passed with
  children still unresolved die with the error 'children timed out'; their
  own policy applies upward (docs/explanation/protocol.md#scheduling). A parent that is no longer
  awaiting_children (released, dead, removed) just leaves the deadlines zset.

  KEYS[1] deadlines zset       P:{q}:deadlines (score: children deadline, ms)

  ARGV[1] queue name
  ARGV[2] queue key prefix     P:{q}:
  ARGV[3] now (ms)
  ARGV[4] limit: at most this many parents per call

  returns: JSON {expired: n, released, dead, flow_failed, revived, reattach,
           outbox}
  errors:  none
]]
local deadlines = KEYS[1]
local QUEUE = ARGV[1]
-- @include lib/flow.lua
local base, now = ARGV[2], tonumber(ARGV[3])

OUT.expired = 0
local ids = redis.call('ZRANGEBYSCORE', deadlines, '-inf', now, 'LIMIT', 0, tonumber(ARGV[4]))
for _, id in ipairs(ids) do
  redis.call('ZREM', deadlines, id)
  if row_hmget(job_key(base, id), F_STATE)[1] == 'awaiting_children' then
    kill(base, id, 'children timed out', now)
    OUT.expired = OUT.expired + 1
  end
end
return cjson.encode(OUT)
