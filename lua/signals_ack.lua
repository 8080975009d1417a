--[[
  signals_ack: after the dispatcher sent a batch of a queue's durable events
  (DESIGN §10.6), remove the ones every receiver returned for, and move the
  ones whose receivers kept raising to the dead-letter list, in one step: an
  event is never both gone from the stream and missing from the dead-letter.
  A replay (redis-py re-sends a command whose reply was lost) or a second
  dispatcher acking the same ids removes nothing more: XDEL of an id that is
  gone is a no-op, and only an event still in the stream is dead-lettered.

  KEYS[1] events stream        P:{q}:signals
  KEYS[2] dead-letter list     P:{q}:signals:deadletter (newest last)
  KEYS[3] tries hash           P:{q}:signals:tries (event id -> sends that raised)

  ARGV[1] now (ms)
  ARGV[2] dead-letter cap: the newest this many entries are kept
  ARGV[3..] pairs, one per event: its stream id, then 'ok' (remove) or a
           reason text (dead-letter it as JSON {event, k, id, n, v, reason,
           tries, at})

  returns: the number of events removed from the stream
  errors:  none
]]
local stream, deadletter, tries = KEYS[1], KEYS[2], KEYS[3]
local now, cap = tonumber(ARGV[1]), tonumber(ARGV[2])

local ids, lettered = {}, 0
for i = 3, #ARGV, 2 do
  local xid, action = ARGV[i], ARGV[i + 1]
  ids[#ids + 1] = xid
  if action ~= 'ok' then
    local found = redis.call('XRANGE', stream, xid, xid)
    if #found == 1 then
      local e, f = {event = xid, reason = action, at = now}, found[1][2]
      for j = 1, #f, 2 do
        e[f[j]] = f[j + 1]
      end
      e.tries = tonumber(redis.call('HGET', tries, xid) or '0')
      redis.call('RPUSH', deadletter, cjson.encode(e))
      lettered = lettered + 1
    end
  end
end
if #ids == 0 then
  return 0
end
if lettered > 0 then
  redis.call('LTRIM', deadletter, -cap, -1)
end
redis.call('HDEL', tries, unpack(ids))
return redis.call('XDEL', stream, unpack(ids))
