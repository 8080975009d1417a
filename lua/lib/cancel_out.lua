--[[
  lib/cancel_out.lua: how many `cancel` entries a parent's cancel left in its
  queue's outbox, kept on the parent's row as `cancel_out`
  (docs/explanation/lifecycle.md#a-retry-takes-a-cancel-back). A retry of the cancelled parent
  must take those entries out of the outbox (delivered later, they would
  cancel its retried children), and the outbox may hold many thousands of
  other entries while the pumps are behind: with the count it searches the
  outbox only when one of its entries is still there (a search of 10,000
  entries held Redis ~37 ms). Inlined by the script loader where `@include
  lib/cancel_out.lua` appears (lib/flow.lua, trim_outbox.lua,
  forget_outbox.lua). Local definitions only.
]]

-- A `cancel` entry for `parent`'s subtree was pushed onto this queue's outbox.
local function cancel_entry_pushed(base, parent)
  redis.call('HINCRBY', base .. 'job:' .. parent, 'cancel_out', 1)
end

-- The parent id a `cancel` entry (its text) names, or nil for any other
-- entry, a poison one included (a plain find first: most entries are not).
local function cancel_parent(text)
  if not text:find('"cancel"', 1, true) then
    return nil
  end
  local ok, e = pcall(cjson.decode, text)
  if ok and type(e) == 'table' and e.k == 'cancel' and type(e.v) == 'string' then
    return e.v
  end
  return nil
end

-- An outbox entry (its text as pushed) left this queue's outbox: delivered,
-- dead-lettered or taken back. A `cancel` one lowers its parent's count; a
-- row that is gone (or never counted) gets no field. The row is this
-- queue's (`base` holds its hash tag): no other slot is touched.
local function outbox_entry_left(base, text)
  local parent = cancel_parent(text)
  if not parent then
    return
  end
  local row = base .. 'job:' .. parent
  if redis.call('HEXISTS', row, 'cancel_out') == 1
      and redis.call('HINCRBY', row, 'cancel_out', -1) <= 0 then
    redis.call('HDEL', row, 'cancel_out')
  end
end
