--[[
  lib/pending.lua: ranges of ids in a queue's pending list
  (docs/explanation/protocol.md#ranges-in-pending). Inlined by the script
  loader through lib/claimable.lua, the one place ids go into pending, and
  into claim.lua, the one place they leave it in order. Local functions
  only; every key is `base .. suffix` on the calling script's slot.

  A flow's generated ids are a 12-byte head and a hex serial that counts up
  (lib/row.lua hex_of), and a flow pushes its leaves in order: 3 to
  PENDING_RUN_MAX such ids in a row are kept as one entry, the first id
  whole, ':' and the last serial in hex:

    GIZFtE9875I_1:64    the ids GIZFtE9875I_1, GIZFtE9875I_2 ... GIZFtE9875I_64

  No id holds ':', so an entry holding one is a range. The counter
  P:{q}:pending:ranged holds how many ids the ranges stand for beyond one
  entry each (the ids in pending less its length); it exists exactly while
  some range does, so a queue without ranges pays one EXISTS per claim and
  reads its list as before.
]]

-- @include lib/row.lua

local PENDING_RUN_MAX = 100  -- ids one range entry stands for at most (core/rows.py RANGE_MAX)

-- A range entry's first id, its head (the first REL_PREFIX bytes), first
-- and last serial; nil for a plain id.
local function pending_range(entry)
  local cut = entry:find(':', 1, true)
  if not cut then
    return nil
  end
  local first = entry:sub(1, cut - 1)
  return first, first:sub(1, REL_PREFIX), tonumber(first:sub(REL_PREFIX + 1), 16),
    tonumber(entry:sub(cut + 1), 16)
end

-- The entry for the ids head .. hex(a) to head .. hex(b), a <= b.
local function pending_entry(head, a, b)
  local first = head .. string.format('%x', a)
  return a == b and first or (first .. ':' .. string.format('%x', b))
end

-- Add `delta` to the counter of ids beyond one entry each; gone at 0.
local function pending_ranged_add(base, delta)
  if delta == 0 then
    return
  end
  local key = base .. 'pending:ranged'
  if redis.call('INCRBY', key, delta) <= 0 then
    redis.call('DEL', key)
  end
end

-- RPUSH ids[1..n] on the pending list, each run of 3 or more consecutive
-- serials of one head (at most PENDING_RUN_MAX) as one range entry.
local function pending_push(base, ids, n)
  local key = base .. 'pending'
  local out, beyond, i = ids, 0, 1
  if n >= 3 then
    out = {}
    while i <= n do
      local id = ids[i]
      local s = #id > REL_PREFIX and hex_of(id:sub(REL_PREFIX + 1))
      local k = 0  -- the ids that follow it in its run
      if s and i + 2 <= n then
        local head = id:sub(1, REL_PREFIX)
        local limit = math.min(n - i, PENDING_RUN_MAX - 1, MAX_SERIAL - s)
        while k < limit and ids[i + k + 1] == head .. string.format('%x', s + k + 1) do
          k = k + 1
        end
      end
      if k >= 2 then
        out[#out + 1] = id .. ':' .. string.format('%x', s + k)
        beyond = beyond + k
        i = i + k + 1
      else
        out[#out + 1] = id
        i = i + 1
      end
    end
    n = #out
  end
  for j = 1, n, 1000 do  -- unpack() has a stack limit: push by the thousand
    redis.call('RPUSH', key, unpack(out, j, math.min(j + 999, n)))
  end
  pending_ranged_add(base, beyond)
end

-- LPOP up to n ids from the pending list, ranges taken apart: a range used
-- in part leaves the rest of its ids at the head. False when it is empty.
-- `ranged`: whether the caller found the counter (pending:ranged) there.
local function pending_pop(base, n, ranged)
  local key = base .. 'pending'
  if not ranged then
    return redis.call('LPOP', key, n)
  end
  local entries = redis.call('LRANGE', key, 0, n - 1)
  if #entries == 0 then
    return false
  end
  local ids, popped = {}, 0
  for _, entry in ipairs(entries) do
    local first, head, a, b = pending_range(entry)
    if not first then
      ids[#ids + 1] = entry
      popped = popped + 1
    else
      local last = math.min(b, a + n - #ids - 1)
      for s = a, last do
        ids[#ids + 1] = head .. string.format('%x', s)
      end
      if last < b then  -- its rest stays first in line
        if popped > 0 then
          redis.call('LPOP', key, popped)
        end
        redis.call('LSET', key, 0, pending_entry(head, last + 1, b))
        pending_ranged_add(base, popped - #ids)
        return ids
      end
      popped = popped + 1
    end
    if #ids >= n then
      break
    end
  end
  redis.call('LPOP', key, popped)
  pending_ranged_add(base, popped - #ids)
  return ids
end

-- Take `id` out of a range of the pending list (LREM found it nowhere as
-- an entry): the range is split around it. True when one held it.
local function pending_unrange(base, id)
  local key = base .. 'pending'
  local s = #id > REL_PREFIX and redis.call('EXISTS', base .. 'pending:ranged') == 1
    and hex_of(id:sub(REL_PREFIX + 1))
  if not s then
    return false
  end
  local head = id:sub(1, REL_PREFIX)
  local at, chunk = 0, 1000
  while true do
    local entries = redis.call('LRANGE', key, at, at + chunk - 1)
    for j, entry in ipairs(entries) do
      local first, h, a, b = pending_range(entry)
      if first and h == head and a <= s and s <= b then
        local before = a < s and pending_entry(head, a, s - 1)
        local after = s < b and pending_entry(head, s + 1, b)
        redis.call('LSET', key, at + j - 1, before or after)
        if before and after then
          redis.call('LINSERT', key, 'AFTER', before, after)
        end
        pending_ranged_add(base, (before and after) and -2 or -1)
        return true
      end
    end
    if #entries < chunk then
      return false
    end
    at = at + chunk
  end
end
