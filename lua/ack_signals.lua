--[[
  ack_signals: the dispatcher's one call per batch (docs/explanation/signals.md): remove the
  durable events every receiver returned for, move the ones whose receivers
  kept raising to the dead-letter list (in one step: an event is never both
  gone from the stream and missing from the dead-letter), then read the
  next batch. A replay (redis-py re-sends a command whose reply was lost) or
  a second dispatcher acking the same ids removes nothing more: XDEL of an
  id that is gone is a no-op, and only an event still in the stream is
  dead-lettered. The batch comes back as one JSON text, which the host
  decodes in one call instead of parsing nested stream replies.

  KEYS[1] events stream        P:{q}:signals
  KEYS[2] dead-letter list     P:{q}:signals:deadletter (newest last)
  KEYS[3] tries hash           P:{q}:signals:tries (event id -> sends that raised)

  ARGV[1] now (ms)
  ARGV[2] dead-letter cap: the newest this many entries are kept
  ARGV[3] how many events to read after the ack (0: none)
  ARGV[4..] pairs, one per event: its stream id, then 'ok' (remove) or a
           reason text (dead-letter it as JSON {event, k, id, n, v, reason,
           tries, at})

  returns: JSON {removed: n, next: [ [stream id, kind, job id, job name,
           value or null], ...]}, the oldest events left, in order
  errors:  none
]]
local stream, deadletter, tries = KEYS[1], KEYS[2], KEYS[3]
local now, cap, count = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])

local ids, lettered, removed = {}, 0, 0
for i = 4, #ARGV, 2 do
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
if lettered > 0 then
  redis.call('LTRIM', deadletter, -cap, -1)
end
if #ids > 0 then
  redis.call('HDEL', tries, unpack(ids))
  removed = redis.call('XDEL', stream, unpack(ids))
end

local next = {}
if count > 0 then
  for _, entry in ipairs(redis.call('XRANGE', stream, '-', '+', 'COUNT', count)) do
    local e, f = {}, entry[2]
    for j = 1, #f, 2 do
      e[f[j]] = f[j + 1]
    end
    next[#next + 1] = {entry[1], e.k or '', e.id or '', e.n or '', e.v or cjson.null}
  end
end
return cjson.encode({removed = removed, next = next})
