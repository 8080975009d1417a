--[[
  enqueue_flow: land the nodes of a flow that live on this queue's slot, in one
  atomic step; its claimable leaves wake the queue's workers once
  (lib/claimable.lua, docs/explanation/no-polling.md#wake-keys). docs/explanation/protocol.md#parent-first-add: the host sends
  parents before their children, so a parent is always held (awaiting_children,
  :dependencies = all its children) before any child of it can be claimed.

  Every id is gated before anything is written: a row that already exists
  with the same name, parent and children is skipped (adding the same flow
  again is a no-op, and a half-landed cross-queue add completes); a
  completed row with no parent, the same name and children, met as a child,
  is adopted (docs/explanation/lifecycle.md: it gets the parent fields); any other existing
  row refuses the whole call.

  Ids after removal (docs/explanation/lifecycle.md): a skipped or adopted child that has
  finished announces its outcome to its parent again, exactly as when it
  finished (completed: fan-in of its stored result; dead: its policy), here
  or through the outbox. The parent's guards make that a no-op when the
  parent has it already; a parent landed fresh (its first row was removed)
  counts it at once, so it never waits for a child that finished before it.

  Rows are compact (docs/explanation/protocol.md#compact-rows): `attempts` appears at
  the first claim; `max_attempts` / `backoff_ms` only when the node sets its
  own; the parent's queue (in `p`) only for a cross-queue child; `pp` (the policy) only
  when it is not 'fp'; `s` only when not pending; `ca` only when `pi` does not carry it.
  A missing one means the queue's setting / this queue / 'fp' / pending / `pi`'s time.
  One `added` event is emitted per held parent (the mirror reads its children from :children) and
  per root; the cross-queue leaves it writes are announced in runs, one
  `added` entry naming up to RUN_IDS (100) of them (lib/emit.lua emit_run); a same-queue
  leaf is announced by its parent's.

  KEYS[1] pending list         P:{q}:pending
  KEYS[2] awaiting zset        P:{q}:awaiting (score: held-at, ms)

  ARGV[1] queue name
  ARGV[2] queue key prefix     P:{q}: (node rows are P:{q}:job:<id>, same slot)
  ARGV[3] now (ms)
  ARGV[4] mode: 'write' lands the nodes; 'check' only gates them
  ARGV[5] nodes, parents first, as one flat JSON array of strings (flat: a
          nested array costs Redis several times more to decode). Nodes come
          in groups sharing everything but id, payload and children:
            name, parent id ('' for a root), parent queue, policy
            ('fp'|'id'|'rd'), max_attempts ('' = the queue's), backoff_ms
            (ms; '' = the queue's), gate ('1' = check the id is free; '0'
            for ids the host generated with 72 random bits), node count,
            options ('' or a JSON object of scheduling settings, docs/explanation/protocol.md#scheduling: p
            priority, d delay (ms), t timeout (ms), ct children timeout
            (ms, parents only), k dedup key and kt its ttl (ms), leaves
            only, so a group with k holds one node; kp keep (ms),
            docs/explanation/lifecycle.md: at most this long after the node finishes; tc
            the W3C traceparent of the caller's add span, stored as
            `traceparent`, docs/howto/tracing.md; r the node's own retry policy,
            JSON kept as `retry_policy`, and x its expiry (ms after it is due:
            `expires_at` = now + d + x), cb its callbacks, JSON kept as
            `callbacks`, docs/howto/retries.md; g its group, kept as `group`,
            docs/explanation/protocol.md#groups), inc (a
            parent with a child on another queue: its incarnation token,
            stored as `inc` when the row is written; '' for a leaf),
            parent inc (a child on another queue than its parent: the
            parent's incarnation, stored as `pi`; '' otherwise: a
            child on this queue is given its parent row's `inc`),
          then per node: id, payload (JSON text), entry count n, n
          :children entries as the list holds them (lib/row.lua: the id
          for a child on this queue, '<queue>:<id>' for one on another, ':'
          or '<queue>::' and the rest of an id sharing the node's first
          12 bytes, or a range of such rests, ':<a>:<b>': its children
          counted in the row's `cn`).
          A node whose options hold dep = 1 is a dependency (depends_on,
          docs/howto/canvas.md#depends-on-existing-jobs): an existing job
          (name and payload '' and unused) that its parent waits for like a
          child. It must exist and have no parent (or this one already);
          it is linked (its parent fields written) and, when it has
          finished, announced at once (completed: fan-in; dead: its
          policy). One gone since the host checked it resolves a parent
          already landed as a removed dependency.
          A leaf whose dedup key names a live job (not completed, not dead)
          is not written; its parent stops waiting for it (recorded in
          :removed, like remove_dependency: here, or through this queue's
          outbox for a parent on another slot).
  ARGV[6] '1': one server holds every queue
          (docs/explanation/protocol.md#cross-queue-scripts-on-one-server):
          a child on another queue than its parent takes the parent's
          incarnation from the parent's row, instead of the parent inc
          sent; and a group whose parent is not landed by this call (on
          another queue, or on this one in an earlier step) lands only if
          the parent's :children lists its first node (the parent's step,
          pipelined ahead of this one, may have been refused); a
          completed child met again resolves a parent on another queue in
          the call, as complete does (docs/explanation/protocol.md#fan-in-on-one-server);
          '0' (a Cluster, or steps sent one after another): as sent

  returns: {landed, skipped, outbox} counts (outbox: entries pushed for
           parents on other slots by announcing children), then the
           parents met again whose incarnation is not the one sent, as one
           array {id, its inc ('' for none), ...} (their children on other
           queues must carry theirs: docs/explanation/protocol.md#incarnations), then per deduplicated leaf:
           its id, the live job's id
  errors:  EMQCONFLICT <queue> <id> <detail>  an id is taken by another job,
           or a dependency is already waited for by another job;
           nothing is written
           EMQNOJOB <queue> <id>   a dependency does not exist (in 'check'
           mode, or before its parent landed), or (ARGV[6] '1') a parent
           not landed by this call does not list its child; nothing is
           written
]]
local awaiting = KEYS[2]
local QUEUE = ARGV[1]
-- @include lib/flow.lua
local queue, base, now, mode = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local a = cjson.decode(ARGV[5])
local across = ARGV[6] == '1' and mode == 'write'
ONE_SERVER = across  -- a finished child met again resolves its parent here (lib/flow.lua)

-- (ARGV[6] '1') the row of a parent on another queue: P:{pq}:job:<id>
local function parent_row(pq, parent)
  return base:match('^(.-){') .. '{' .. pq .. '}:job:' .. parent
end

-- (ARGV[6] '1') whether the parent's step landed (or met it again): its
-- :children lists `id` (a group's first node: one LPOS a group, more for a
-- list written before: lib/row.lua child_listed)
local function listed(pq, parent, id)
  local prow = parent_row(pq, parent)
  return child_listed(prow .. ':children', prow:sub(1, #prow - #parent - 4), parent,
    base .. 'job:' .. id)
end

-- whether row `id`'s :children holds the children of the n entries sent
-- from a[from] (in the form written now), compared as full keys: a list written before may hold
-- another form (lib/row.lua child_key)
local function same_children(id, from, n)
  local kids = base .. 'job:' .. id .. ':children'
  local have, held = {}, 0
  for _, key in ipairs(child_keys(base, id, redis.call('LRANGE', kids, 0, -1))) do
    have[key], held = true, held + 1
  end
  local sent = child_keys(base, id, a, from, from + n - 1)
  if #sent ~= held then
    return false
  end
  for _, key in ipairs(sent) do
    if not have[key] then
      return false
    end
  end
  return true
end

-- the live job holding a dedup key, or nil (docs/explanation/protocol.md#scheduling)
local function live_holder(key, id)
  local live = redis.call('GET', base .. 'dedup:' .. key)
  if live and live ~= id then
    local st = row_hmget_s(base .. 'job:' .. live, F_STATE)[1]
    if st and st ~= 'completed' and st ~= 'dead' then
      return live
    end
  end
  return nil
end

-- pass 1: gate every id before anything is written
local skip = {}
local adopt = {}  -- id -> true: a completed parentless job attached as a child
local deduped, found = {}, {}  -- leaves whose dedup key is held by a live job
local kept = {}  -- parents met again: id, their own incarnation
local gone = {}  -- dependencies removed since the host checked them: id -> true
local total, skipped = 0, 0
local here = {}  -- (ARGV[6] '1') the parents this call lands: id -> true
local i = 1
while i <= #a do
  local name, parent, pq, gate, count = a[i], a[i + 1], a[i + 2], a[i + 6], tonumber(a[i + 7])
  local opts = (a[i + 8] ~= '') and cjson.decode(a[i + 8]) or nil
  local inc = a[i + 9]
  i = i + 11
  -- a parent in an earlier step, on this queue (a later depth, a chunk) or
  -- on another: that step may have been refused
  if across and parent ~= '' and (pq ~= queue or not here[parent])
      and not listed(pq, parent, a[i]) then
    return redis.error_reply('EMQNOJOB ' .. pq .. ' ' .. parent)
  end
  -- a fresh group (ids the host generated, no options) has nothing to gate
  -- (no existing row, dedup key or dependency to look up): only stepped over
  local fresh = gate ~= '1' and not opts
  for _ = 1, fresh and count or 0 do
    if across and a[i + 2] ~= '0' then
      here[a[i]] = true
    end
    i = i + 3 + tonumber(a[i + 2])
  end
  if fresh then
    total = total + count
    count = 0
  end
  for _ = 1, count do
    local id, nrefs = a[i], tonumber(a[i + 2])
    local row = base .. 'job:' .. id
    local live = opts and opts.k and live_holder(opts.k, id)
    if opts and opts.dep then
      local f = row_hmget_p(row, F_STATE, F_PARENT, F_PQUEUE)
      if not f[1] then
        local landed = pq ~= queue or redis.call('EXISTS', base .. 'job:' .. parent) == 1
        if mode ~= 'write' or not landed then
          return redis.error_reply('EMQNOJOB ' .. queue .. ' ' .. id)
        end
        gone[id] = true
      elseif f[2] and (f[2] ~= parent or (f[3] or queue) ~= pq) then
        return redis.error_reply('EMQCONFLICT ' .. queue .. ' ' .. id .. ' is already waited for by '
          .. (f[3] or queue) .. '/' .. f[2] .. ' (depends_on: a job is waited for by one job at most)')
      end
      skip[id] = true
      skipped = skipped + 1
    elseif live and redis.call('EXISTS', row) == 0 then
      deduped[id] = live
      found[#found + 1] = id
      found[#found + 1] = live
    elseif gate == '1' and redis.call('EXISTS', row) == 1 then
      local f = row_hmget_p(row, F_NAME, F_PARENT, F_PQUEUE, F_STATE, 'inc')
      local fpq = f[3] or queue
      if parent ~= '' and not f[2] and f[1] == name and f[4] == 'completed' then
        adopt[id] = true
      elseif f[1] ~= name or (f[2] or '') ~= parent or (parent ~= '' and fpq ~= pq) then
        return redis.error_reply('EMQCONFLICT ' .. queue .. ' ' .. id .. ' exists as job '
          .. tostring(f[1]) .. ' under parent ' .. (f[2] and (fpq .. '/' .. f[2]) or '(none)'))
      end
      if not same_children(id, i + 3, nrefs) then
        return redis.error_reply('EMQCONFLICT ' .. queue .. ' ' .. id
          .. ' exists with other children (a different flow under the same id:'
          .. ' add it under a new id, or remove the old flow first)')
      end
      skip[id] = true
      skipped = skipped + 1
      if inc ~= '' and f[5] ~= inc and nrefs > 0 then
        kept[#kept + 1] = id
        kept[#kept + 1] = f[5] or ''
      end
    end
    if across and nrefs > 0 then
      here[id] = true
    end
    total = total + 1
    i = i + 3 + nrefs
  end
end
local function reply(outbox)
  local out = {total - skipped - #found / 2, skipped, outbox, kept}
  for _, v in ipairs(found) do
    out[#out + 1] = v
  end
  return out
end
if mode ~= 'write' then
  return reply(0)
end

-- a finished child met again tells its parent how it ended (guarded there)
local function announce(id, parent, pq)
  local row = base .. 'job:' .. id
  local f = row_hmget(row, F_STATE, 'result', F_PINC)
  if f[1] == 'completed' then
    resolve_done(base, id, f[2], tonumber(now), parent, pq ~= queue and pq or nil, f[3])
  elseif f[1] == 'dead' then
    propagate_death(base, id, get_error(row) or '', tonumber(now))
  end
end

-- A child's link to its parent, appended to `t` as field, value pairs (a
-- row stores the policy only when it is not 'fp', the parent's incarnation
-- only when known: compact rows), the parent as child `id`'s row holds it:
-- its id, and its queue when it differs (lib/row.lua parent_ref).
local function parent_fields(t, id, parent, pq, policy, pinc)
  t[#t + 1] = F_PARENT
  t[#t + 1] = parent_ref(id, parent, pq ~= queue and pq or nil)
  if policy ~= 'fp' then
    t[#t + 1] = F_POLICY
    t[#t + 1] = policy
  end
  if pinc ~= '' then
    t[#t + 1] = F_PINC
    t[#t + 1] = pinc
  end
  return t
end

-- pass 2: write
local claimable, nclaim = {}, 0
local silent = 0  -- same-queue leaves written: they emit no event of their own
local run = {}  -- cross-queue leaves written and not yet announced: one `added` per RUN_IDS
i = 1
while i <= #a do
  local name, parent, pq, policy, ma, bo, count =
    a[i], a[i + 1], a[i + 2], a[i + 3], a[i + 4], a[i + 5], tonumber(a[i + 7])
  local opts = (a[i + 8] ~= '') and cjson.decode(a[i + 8]) or {}
  local inc, pinc = a[i + 9], a[i + 10]
  local fresh = a[i + 6] ~= '1' and a[i + 8] == ''  -- as in pass 1: nothing was gated
  i = i + 11
  if parent ~= '' and pq == queue then  -- the parent's own incarnation: its row is on this slot
    pinc = redis.call('HGET', base .. 'job:' .. parent, 'inc') or ''
  elseif parent ~= '' and across then  -- on one server: read where it is, checked in pass 1
    pinc = redis.call('HGET', parent_row(pq, parent), 'inc') or ''
  end
  -- the fields every node of the group shares, after name/payload/state/ca
  local shared = {}
  if ma ~= '' then
    shared[#shared + 1] = 'max_attempts'
    shared[#shared + 1] = ma
  end
  if bo ~= '' then
    shared[#shared + 1] = 'backoff_ms'
    shared[#shared + 1] = bo
  end
  -- where the parent's `p` sits in `shared`, set per node: `prel` (its
  -- relative form, lib/row.lua parent_ref) for a node whose id starts with
  -- `ppre`, `pabs` (the whole id) for any other
  local pslot, ppre, prel, pabs
  if parent ~= '' then
    pslot, ppre = #shared + 2, parent:sub(1, REL_PREFIX)
    parent_fields(shared, parent, parent, pq, policy, pinc)
    prel = shared[pslot]
    pabs = parent_ref('', parent, pq ~= queue and pq or nil)
  end
  if inc ~= '' then
    shared[#shared + 1] = 'inc'
    shared[#shared + 1] = inc
  end
  local delay = tonumber(opts.d or 0)
  local expires = opts.x and string.format('%.0f', tonumber(now) + delay + opts.x)
  for _, f in ipairs({{'priority', opts.p}, {'timeout_ms', opts.t}, {'dedup', opts.k},
      {'keep', opts.kp}, {'traceparent', opts.tc}, {'retry_policy', opts.r},
      {'expires_at', expires}, {'callbacks', opts.cb}, {'group', opts.g}}) do
    if f[2] then  -- scheduling settings, stored only when set (compact rows)
      shared[#shared + 1] = f[1]
      shared[#shared + 1] = tostring(f[2])
    end
  end
  local event = parent == '' or pq ~= queue
  -- a fresh group's leaves: one HSET each from one argument table (its row
  -- and payload set per leaf), pending, announced as the general path
  -- below does (a cross-queue leaf in a run, a root by its own event, a
  -- same-queue leaf by its parent's)
  -- no `ca` where `pi` carries this add's time (lib/row.lua created_of)
  local ca = {F_CREATED, now}
  if parent ~= '' and pinc ~= '' and pinc:sub(1, -7) == now then
    ca = {}
  end
  local leaf = fresh and {'HSET', false, F_NAME, name, F_DATA, false, unpack(ca)}
  local at = leaf and #leaf  -- `shared` follows
  if leaf then  -- pending: no `s` (lib/row.lua pending_if_there)
    for k = 1, #shared do
      leaf[at + k] = shared[k]
    end
  end
  local in_run = parent ~= '' and pq ~= queue
  local jobs, call = base .. 'job:', redis.call
  for _ = 1, count do
    if leaf and a[i + 2] == '0' then
      local id = a[i]
      leaf[2] = jobs .. id
      leaf[6] = a[i + 1]
      if pslot then
        leaf[at + pslot] = (id:sub(1, REL_PREFIX) == ppre) and prel or pabs
      end
      call(unpack(leaf))
      nclaim = nclaim + 1
      claimable[nclaim] = id
      if in_run then
        run[#run + 1] = id
        if #run == RUN_IDS then
          emit_run(base .. 'events', 'added', run)
          run = {}
        end
      elseif event then
        emit(base, 'added', id)
      else
        silent = silent + 1
      end
      i = i + 3
    else
      local id, payload, nrefs = a[i], a[i + 1], tonumber(a[i + 2])
      local row = base .. 'job:' .. id
      if opts.dep and gone[id] then
        local why = 'dependency gone: job ' .. id .. ' was removed before it was linked'
        if pq == queue then
          fan_in_dead(base, parent, row, why, 'rd', tonumber(now))
        else
          push_outbox(base, cjson.encode({k = 'dead', c = row, p = parent, q = pq, pol = 'rd',
            v = why, i = (pinc ~= '') and pinc or nil}))
        end
      elseif opts.dep then
        keep_created(row, pinc)  -- its `pi` changes
        redis.call('HSET', row, unpack(parent_fields({}, id, parent, pq, policy, pinc)))
        redis.call('HDEL', row, F_PQUEUE, LONG_NAME[F_PQUEUE])  -- `p` says it now
        announce(id, parent, pq)  -- finished already: counts at once (guarded)
      elseif deduped[id] then
        local why = 'deduplicated: job ' .. deduped[id] .. ' holds key ' .. opts.k
        if parent ~= '' and pq == queue then
          fan_in_dead(base, parent, base .. 'job:' .. id, why, 'rd', tonumber(now))
        elseif parent ~= '' then
          push_outbox(base, cjson.encode({k = 'dead',
            c = base .. 'job:' .. id, p = parent, q = pq, pol = 'rd', v = why,
            i = (pinc ~= '') and pinc or nil}))
        end
      elseif skip[id] and parent ~= '' then
        if adopt[id] then
          -- the row keeps its own incarnation mark: no pi here
          redis.call('HSET', row, unpack(parent_fields({}, id, parent, pq, policy, '')))
          redis.call('HDEL', row, F_PQUEUE, LONG_NAME[F_PQUEUE])  -- `p` says it now
        end
        -- under its parent again (docs/explanation/lifecycle.md), and under this incarnation of
        -- it (a parent landed fresh has a new one): a cancel mark a removed
        -- flow's cancel left on it while it ran is that flow's, not this one's
        local was = row_hmget(row, F_PINC, 'orphaned')
        if was[2] or (pinc ~= '' and was[1] and was[1] ~= pinc) then
          redis.call('HDEL', row, 'orphaned', 'cancel')
        end
        if pinc ~= '' then
          keep_created(row, pinc)
          redis.call('HSET', row, F_PINC, pinc)
        end
        announce(id, parent, pq)
      elseif not skip[id] then
        local state = (nrefs > 0) and 'awaiting_children' or 'pending'
        if nrefs == 0 and delay > 0 then
          state = 'delayed'
        end
        if pslot then
          shared[pslot] = (id:sub(1, REL_PREFIX) == ppre) and prel or pabs
        end
        local head = {F_NAME, name, F_DATA, payload, unpack(ca)}
        if state ~= 'pending' then  -- a fresh row: no `s` when pending (lib/row.lua)
          head[#head + 1], head[#head + 2] = F_STATE, state
        end
        local kids = (nrefs > 0) and child_count(a, i + 3, nrefs) or 0
        if kids > nrefs then  -- the list holds a range: the row counts (lib/row.lua)
          head[#head + 1], head[#head + 2] = F_KIDS, kids
        end
        for k = 1, #shared do
          head[#head + 1] = shared[k]
        end
        redis.call('HSET', row, unpack(head))
        if opts.k then
          if opts.kt then
            redis.call('SET', base .. 'dedup:' .. opts.k, id, 'PX', opts.kt)
          else
            redis.call('SET', base .. 'dedup:' .. opts.k, id)
          end
        end
        if nrefs > 0 then
          for j = i + 3, i + 2 + nrefs, 1000 do  -- sent in the list's form
            redis.call('RPUSH', row .. ':children', unpack(a, j, math.min(j + 999, i + 2 + nrefs)))
          end
          redis.call('SET', row .. ':dependencies', kids)
          redis.call('ZADD', awaiting, now, id)
          if delay > 0 then
            redis.call('HSET', row, 'delay_until', now + delay)
          end
          if opts.ct then
            redis.call('HSET', row, 'children_deadline', now + opts.ct)
            redis.call('ZADD', base .. 'deadlines', now + opts.ct, id)
          end
        elseif delay > 0 then
          make_delayed(base, id, now + delay)
        elseif opts.p or opts.g then  -- a group: lib/groups.lua
          make_claimable(base, {id}, opts.p, false, opts.g)
        else
          nclaim = nclaim + 1
          claimable[nclaim] = id
        end
        if nrefs == 0 and parent ~= '' and pq ~= queue then
          run[#run + 1] = id
          if #run == RUN_IDS then
            emit_run(base .. 'events', 'added', run)
            run = {}
          end
        elseif event or nrefs > 0 then
          emit(base, 'added', id)
        else
          silent = silent + 1  -- announced by its parent's event, counted apart
        end
      end
      i = i + 3 + nrefs
    end
  end
end
emit_run(base .. 'events', 'added', run)
make_claimable(base, claimable)  -- pushed in order, one wake-up for the call
count_minute(base, 'added', silent, tonumber(redis.call('TIME')[1]) * 1000)
return reply(OUT.outbox)
