--[[
  enqueue_flow: land the nodes of a flow that live on this queue's slot, in one
  atomic step. DESIGN §5 `enqueue_flow`, and the per-slot steps of the
  cross-queue add (§6 `hold_parent`, `enqueue_flow_child`): the host sends
  parents before their children, so a parent is always held (awaiting_children,
  :dependencies = all its children) before any child of it can be claimed.

  Every id is gated before anything is written: a row that already exists
  with the same name and parent is skipped (adding the same flow again is a
  no-op, and a half-landed cross-queue add completes); any other existing row
  refuses the whole call.

  KEYS[1] pending list         P:{q}:pending
  KEYS[2] awaiting zset        P:{q}:awaiting (score: held-at, ms)

  ARGV[1] queue name
  ARGV[2] queue key prefix     P:{q}: (node rows are P:{q}:job:<id>, same slot)
  ARGV[3] now (ms)
  ARGV[4] mode: 'write' lands the nodes; 'check' only gates them
  ARGV[5..] nodes, 9 values each:
           id, name, payload (JSON text), max_attempts, backoff_ms (ms),
           parent id ('' for a root), parent queue, policy ('fp'|'id'|'rd'),
           child refs (space-separated full job keys; '' for a leaf)

  returns: {landed, skipped} counts
  errors:  EMQCONFLICT <queue> <id> <detail>  an id is taken by another job;
           nothing is written
]]
local pending, awaiting = KEYS[1], KEYS[2]
local queue, base, now, mode = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local FIELDS = 9

local skip = {}
local skipped = 0
for i = 5, #ARGV, FIELDS do
  local id, name, parent = ARGV[i], ARGV[i + 1], ARGV[i + 5]
  local f = redis.call('HMGET', base .. 'job:' .. id, 'name', 'parent', 'parent_queue')
  if f[1] then
    if f[1] ~= name or (f[2] or '') ~= parent or (parent ~= '' and f[3] ~= ARGV[i + 6]) then
      return redis.error_reply('EMQCONFLICT ' .. queue .. ' ' .. id .. ' exists as job ' .. f[1]
        .. ' under parent ' .. tostring(f[3] or '') .. '/' .. tostring(f[2] or '(none)'))
    end
    -- same name and parent: the same node only if it has the same children
    local kids = base .. 'job:' .. id .. ':children'
    local want = 0
    for ref in string.gmatch(ARGV[i + 8], '%S+') do
      want = want + 1
      if redis.call('SISMEMBER', kids, ref) == 0 then
        want = -1
        break
      end
    end
    if want ~= redis.call('SCARD', kids) then
      return redis.error_reply('EMQCONFLICT ' .. queue .. ' ' .. id
        .. ' exists with other children (a different flow under the same id)')
    end
    skip[i] = true
    skipped = skipped + 1
  end
end
if mode ~= 'write' then
  return {(#ARGV - 4) / FIELDS - skipped, skipped}
end

local landed = 0
for i = 5, #ARGV, FIELDS do
  if not skip[i] then
    local id, refs = ARGV[i], ARGV[i + 8]
    local row = base .. 'job:' .. id
    local state = 'pending'
    if refs ~= '' then
      state = 'awaiting_children'
    end
    redis.call('HSET', row, 'name', ARGV[i + 1], 'payload', ARGV[i + 2], 'state', state,
      'attempts', 0, 'max_attempts', ARGV[i + 3], 'backoff_ms', ARGV[i + 4], 'created_at', now)
    if ARGV[i + 5] ~= '' then
      redis.call('HSET', row, 'parent', ARGV[i + 5], 'parent_queue', ARGV[i + 6],
        'parent_policy', ARGV[i + 7])
    end
    if state == 'pending' then
      redis.call('RPUSH', pending, id)
    else
      local n = 0
      local members = {}
      for ref in string.gmatch(refs, '%S+') do
        n = n + 1
        members[#members + 1] = ref
        if #members == 1000 then
          redis.call('SADD', row .. ':children', unpack(members))
          members = {}
        end
      end
      if #members > 0 then
        redis.call('SADD', row .. ':children', unpack(members))
      end
      redis.call('SET', row .. ':dependencies', n)
      redis.call('ZADD', awaiting, now, id)
    end
    redis.call('XADD', base .. 'events', 'MAXLEN', '~', 10000, '*', 'e', 'added', 'id', id)
    landed = landed + 1
  end
end
return {landed, skipped}
