--[[
  lib/error.lua: a job row's `error` in pieces
  (docs/explanation/protocol.md#errors-in-pieces), inlined by the script loader where `@include
  lib/error.lua` appears (lib/flow.lua includes it). Local definitions
  only; no key is touched until a script calls them.

  Redis keeps a small hash as one compact listpack only while every value
  is at most `hash-max-listpack-value` bytes (64 by default); one longer
  value turns the whole row into a hashtable, ~2.5x the bytes for a small
  row. An error with its traceback is longer, so each dead job (and each
  job that failed once) cost ~1.1 KB where ~0.5 KB holds the same. So an
  error longer than ERROR_PIECE bytes is kept in pieces: `error` holds the
  first, `error.2` ... `error.<n>` the rest and `error.n` = n; a piece never
  cuts a UTF-8 character (a piece ends before a continuation byte). An
  error of more than ERROR_PIECES_MAX pieces (~1.5 KB) is kept whole: each
  piece costs ~12 bytes of field name and listpack framing, and a listpack
  grows in coarse allocator steps, so past ~1.8 KB the pieces cost more
  than the hashtable (MEMORY USAGE, a 13-field row: an error of 182 bytes
  1,072 -> 496, 600 bytes 1,520 -> 1,072, 1,280 bytes 2,416 -> 1,840,
  2,000 bytes 2,928 -> 3,120).
  Readers join them: get_error here, `jobs.row_error` on the host.
]]

local ERROR_PIECE = 64
local ERROR_PIECES_MAX = 24

-- Drop a row's error and its pieces.
local function clear_error(key)
  local n = tonumber(redis.call('HGET', key, 'error.n') or '1')
  local fields = {'error', 'error.n'}
  for i = 2, n do
    fields[#fields + 1] = 'error.' .. i
  end
  redis.call('HDEL', key, unpack(fields))
end

-- Write `err` as the row's error (in pieces when it is long), replacing the
-- one it held.
local function set_error(key, err)
  if redis.call('HEXISTS', key, 'error.n') == 1 then
    clear_error(key)
  end
  local len = #err
  if len <= ERROR_PIECE or len > ERROR_PIECE * ERROR_PIECES_MAX then
    redis.call('HSET', key, 'error', err)
    return
  end
  local args, at, n = {}, 1, 0
  while at <= len do
    local stop = math.min(at + ERROR_PIECE - 1, len)
    while stop < len and stop > at do
      local b = err:byte(stop + 1)
      if b < 0x80 or b >= 0xC0 then
        break
      end
      stop = stop - 1  -- the next piece would start inside a character
    end
    n = n + 1
    args[#args + 1] = (n == 1) and 'error' or ('error.' .. n)
    args[#args + 1] = err:sub(at, stop)
    at = stop + 1
  end
  if n > 1 then
    args[#args + 1] = 'error.n'
    args[#args + 1] = n
  end
  redis.call('HSET', key, unpack(args))
end

-- The row's whole error (false when it has none).
local function get_error(key)
  local f = redis.call('HMGET', key, 'error', 'error.n')
  if not f[1] or not f[2] then
    return f[1]
  end
  local fields = {}
  for i = 2, tonumber(f[2]) do
    fields[#fields + 1] = 'error.' .. i
  end
  return f[1] .. table.concat(redis.call('HMGET', key, unpack(fields)))
end
