--[[
  add_children: a running job becomes a parent of children it adds (a step
  job, docs/explanation/protocol.md#step-jobs). The parent's half of a
  parent-first add: under the job's lease, its `:children` list gets the new
  refs and `:dependencies` counts them, BEFORE the host lands any child
  (enqueue_flow, on each child's slot), so a child can never finish before
  its parent counts it. The job stays active: a child that resolves while
  its parent still runs is fanned in as usual (lib/flow.lua: a parent that
  is not awaiting_children is never released, and an `fp` death is kept in
  `:failed`); wait_children then holds the parent, or kills it.

  A ref already in `:children` is not counted again, so a replay, or an
  attempt that adds the same children (same ids) again, counts each once:
  the run repeated after a crash between this script and the children's
  landing draws the same generated ids (docs/explanation/protocol.md#step-jobs).
  The row gets `inc` (its incarnation) when it has none.

  KEYS[1] job row              P:{q}:job:<id> (its :children and
          :dependencies are on the same slot)

  ARGV[1] queue name
  ARGV[2] job id
  ARGV[3] lease token (from claim)
  ARGV[4] incarnation to set when the row has none (a decimal integer)
  ARGV[5..] the new children's refs (full job keys; the list holds them
            short: lib/row.lua short_ref)

  returns: {inc, added}: the row's incarnation (the children on other queues
           carry it as `pi`) and how many refs were new
  errors:  EMQNOJOB <queue> <id>            no such job
           EMQSTATE <queue> <id> <state>    the job is not active
           EMQLEASE <queue> <id>            the lease token is stale
]]
local row = KEYS[1]
local queue, id, token, inc = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
-- @include lib/lease.lua
-- @include lib/row.lua
local base = row:sub(1, #row - #('job:' .. id))  -- P:{q}:

local f = row_hmget_s(row, F_STATE, 'lease', 'inc', F_KIDS)
local refused = lease_refused(queue, id, f[1], f[2], token)
if refused then
  return refused
end
local kids = row .. ':children'
local have = {}
for _, key in ipairs(child_keys(base, id, redis.call('LRANGE', kids, 0, -1))) do
  have[key] = true
end
local new = {}
for j = 5, #ARGV do
  if not have[ARGV[j]] then
    have[ARGV[j]] = true
    new[#new + 1] = short_ref(base, id, ARGV[j])  -- the list's form (lib/row.lua)
  end
end
for j = 1, #new, 1000 do
  redis.call('RPUSH', kids, unpack(new, j, math.min(j + 999, #new)))
end
if #new > 0 then
  redis.call('INCRBY', row .. ':dependencies', #new)
  if f[4] then  -- a list holding ranges counts its children (lib/row.lua)
    redis.call('HINCRBY', row, F_KIDS, #new)
  end
end
if not f[3] then
  redis.call('HSET', row, 'inc', inc)
end
return {f[3] or inc, #new}
