--[[
  enqueue_flow: land the nodes of a flow that live on this queue's slot, in one
  atomic step. DESIGN §5 `enqueue_flow`, and the per-slot steps of the
  cross-queue add (§6 `hold_parent`, `enqueue_flow_child`): the host sends
  parents before their children, so a parent is always held (awaiting_children,
  :dependencies = all its children) before any child of it can be claimed.

  Every id is gated before anything is written: a row that already exists
  with the same name, parent and children is skipped (adding the same flow
  again is a no-op, and a half-landed cross-queue add completes); any other
  existing row refuses the whole call.

  Rows are compact (memory and time per node, issue 8): `attempts` appears at
  the first claim; `max_attempts` / `backoff_ms` only when the node sets its
  own; `parent_queue` only for a cross-queue child; `parent_policy` only when
  it is not 'fp'. A missing one means the queue's setting / this queue / 'fp'. One `added` event is emitted per
  held parent (the mirror reads its children from :children), and per node
  without a parent in this call.

  KEYS[1] pending list         P:{q}:pending
  KEYS[2] awaiting zset        P:{q}:awaiting (score: held-at, ms)

  ARGV[1] queue name
  ARGV[2] queue key prefix     P:{q}: (node rows are P:{q}:job:<id>, same slot)
  ARGV[3] now (ms)
  ARGV[4] mode: 'write' lands the nodes; 'check' only gates them
  ARGV[5] nodes, a JSON array of 9-element arrays, parents first:
          id, name, payload (JSON text), max_attempts ('' = the queue's),
          backoff_ms (ms; '' = the queue's), parent id ('' for a root),
          parent queue, policy ('fp'|'id'|'rd'),
          child refs (an array of full job keys; empty for a leaf)
          (numbers travel as strings: Lua numbers cost a conversion per field)

  returns: {landed, skipped} counts
  errors:  EMQCONFLICT <queue> <id> <detail>  an id is taken by another job;
           nothing is written
]]
local pending, awaiting = KEYS[1], KEYS[2]
local queue, base, now, mode = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local nodes = cjson.decode(ARGV[5])

local function same_children(kids, refs)
  if redis.call('LLEN', kids) ~= #refs then
    return false
  end
  local have = {}
  for _, ref in ipairs(redis.call('LRANGE', kids, 0, -1)) do
    have[ref] = true
  end
  for _, ref in ipairs(refs) do
    if not have[ref] then
      return false
    end
  end
  return true
end

local skip = {}
local skipped = 0
for i, n in ipairs(nodes) do
  local row = base .. 'job:' .. n[1]
  if redis.call('EXISTS', row) == 1 then
    local f = redis.call('HMGET', row, 'name', 'parent', 'parent_queue')
    local pq = f[3] or queue
    if f[1] ~= n[2] or (f[2] or '') ~= n[6] or (n[6] ~= '' and pq ~= n[7]) then
      return redis.error_reply('EMQCONFLICT ' .. queue .. ' ' .. n[1] .. ' exists as job '
        .. tostring(f[1]) .. ' under parent ' .. (f[2] and (pq .. '/' .. f[2]) or '(none)'))
    end
    if not same_children(row .. ':children', n[9]) then
      return redis.error_reply('EMQCONFLICT ' .. queue .. ' ' .. n[1]
        .. ' exists with other children (a different flow under the same id)')
    end
    skip[i] = true
    skipped = skipped + 1
  end
end
if mode ~= 'write' then
  return {#nodes - skipped, skipped}
end

local held_here = {}
local claimable = {}
local landed = 0
for i, n in ipairs(nodes) do
  if not skip[i] then
    local id, refs = n[1], n[9]
    local row = base .. 'job:' .. id
    local fields = {'name', n[2], 'payload', n[3], 'state', 'pending', 'created_at', now}
    if n[4] ~= '' then
      fields[#fields + 1] = 'max_attempts'
      fields[#fields + 1] = n[4]
    end
    if n[5] ~= '' then
      fields[#fields + 1] = 'backoff_ms'
      fields[#fields + 1] = n[5]
    end
    if n[6] ~= '' then
      fields[#fields + 1] = 'parent'
      fields[#fields + 1] = n[6]
      if n[7] ~= queue then
        fields[#fields + 1] = 'parent_queue'
        fields[#fields + 1] = n[7]
      end
      if n[8] ~= 'fp' then
        fields[#fields + 1] = 'parent_policy'
        fields[#fields + 1] = n[8]
      end
    end
    if #refs > 0 then
      fields[6] = 'awaiting_children'
      redis.call('HSET', row, unpack(fields))
      for j = 1, #refs, 1000 do
        redis.call('RPUSH', row .. ':children', unpack(refs, j, math.min(j + 999, #refs)))
      end
      redis.call('SET', row .. ':dependencies', #refs)
      redis.call('ZADD', awaiting, now, id)
      held_here[id] = true
      redis.call('XADD', base .. 'events', 'MAXLEN', '~', 10000, '*', 'e', 'added', 'id', id)
    else
      redis.call('HSET', row, unpack(fields))
      claimable[#claimable + 1] = id
      if #claimable == 1000 then
        redis.call('RPUSH', pending, unpack(claimable))
        claimable = {}
      end
      if n[6] == '' or n[7] ~= queue or not held_here[n[6]] then
        redis.call('XADD', base .. 'events', 'MAXLEN', '~', 10000, '*', 'e', 'added', 'id', id)
      end
    end
    landed = landed + 1
  end
end
if #claimable > 0 then
  redis.call('RPUSH', pending, unpack(claimable))
end
return {landed, skipped}
