--[[
  lib/lease.lua: the check every write under a running job's lease makes
  first (docs/explanation/protocol.md#progress-and-log-lines), inlined by the
  script loader where `@include lib/lease.lua` appears (extend_lease,
  write_reports). Local definitions only; no key is touched.

  lease_refused(queue, id, state, lease, token): the error reply when the row
  is missing (`state` false: EMQNOJOB), not active (EMQSTATE <state>) or held
  under another lease (`lease` ~= `token`: EMQLEASE); nil when the write may
  go on.

  split_joined(text): the values of a batch's joined argument, in order: the
  parts of `text` cut at each byte 0x1F (ASCII's unit separator, in neither
  an id, a lease token nor JSON text); none for ''.
]]

local function lease_refused(queue, id, state, lease, token)
  if not state then
    return redis.error_reply('EMQNOJOB ' .. queue .. ' ' .. id)
  end
  if state ~= 'active' then
    return redis.error_reply('EMQSTATE ' .. queue .. ' ' .. id .. ' ' .. state)
  end
  if lease ~= token then
    return redis.error_reply('EMQLEASE ' .. queue .. ' ' .. id)
  end
  return nil
end

local function split_joined(text)
  local values, at, find, sub = {}, 1, string.find, string.sub
  if text == '' then
    return values
  end
  while true do
    local stop = find(text, '\31', at, true)
    if not stop then
      values[#values + 1] = sub(text, at)
      return values
    end
    values[#values + 1] = sub(text, at, stop - 1)
    at = stop + 1
  end
end
