--[[
  lib/row.lua: the short names of a job row's most common fields, spelled
  here once for every script (docs/explanation/protocol.md#the-job-row),
  inlined by the script loader where `@include lib/row.lua` appears
  (lib/flow.lua and lib/emit.lua include it). Local definitions only; no key is touched
  until a script calls row_hmget.

  Why short: a row is a small hash, one listpack whose allocation is
  rounded up to the allocator's size class (80, 96, 112, 128, 160...
  bytes), and a field's name is stored in every row. The handler, payload,
  state and time are on every row and the parent link on every flow node;
  their one- and two-letter names took the benchmark's leaf row from the
  128-byte class to 96 and its cross-queue leaf from 160 to 112
  (docs/explanation/performance.md#memory-per-node).

  Rows written before the rename hold the long names: row_hmget reads
  both (the short one wins), so such jobs finish as they would have;
  every write uses the short name only.
]]

local F_NAME = 'n'      -- the handler: was name
local F_DATA = 'd'      -- the payload (JSON): was payload
local F_STATE = 's'     -- the job's state: was state
local F_CREATED = 'ca'  -- when the job was written (ms): was created_at
local F_PARENT = 'p'    -- a child's parent (its queue too when not the child's): was parent
local F_PQUEUE = 'pq'   -- the parent's queue, rows written before `p` held it: was parent_queue
local F_POLICY = 'pp'   -- a child's policy when not 'fp': was parent_policy
local F_PINC = 'pi'     -- a child's parent's incarnation: was parent_inc
local F_KIDS = 'cn'     -- a parent's children, counted, when its :children holds a range
local LONG_NAME = {[F_NAME] = 'name', [F_DATA] = 'payload', [F_STATE] = 'state',
  [F_CREATED] = 'created_at', [F_PARENT] = 'parent', [F_PQUEUE] = 'parent_queue',
  [F_POLICY] = 'parent_policy', [F_PINC] = 'parent_inc'}

-- A child's parent as its row's `p` holds it
-- (docs/explanation/protocol.md#relative-parent-ids):
--   ':' .. rest         on the child's queue, the parent's id starting with
--                       the child's first REL_PREFIX bytes (a flow's
--                       generated ids share a 12-character prefix: a
--                       fan-out's leaf stores ':0' for its root)
--   '<id>'              on the child's queue, any other id
--   '<queue>::' .. rest the same on another queue
--   '<queue>:<id>'      on another queue, any other id
-- Neither a queue name nor an id holds ':', so each form reads one way. The
-- cut never splits a UTF-8 character (the rest does not start with a
-- continuation byte), so the value stays text. parent_of turns it back,
-- given the child's id. Rows written before the queue went into `p` hold
-- it as `pq`, read where `p` names none. A parent's :children list stores
-- its children the same way round (child_entry, below).
local REL_PREFIX = 12
local byte = string.byte

-- The rest of id `of` after the first REL_PREFIX bytes it shares with id
-- `with`, or nil: none shared, nothing after them, or a cut that would
-- split a UTF-8 character (docs/explanation/protocol.md#relative-parent-ids).
local function rel_rest(of, with)
  local next_byte = byte(of, REL_PREFIX + 1)
  if next_byte and (next_byte < 128 or next_byte >= 192)
      and of:sub(1, REL_PREFIX) == with:sub(1, REL_PREFIX) then
    return of:sub(REL_PREFIX + 1)
  end
  return nil
end

-- `p` for child `id` of `parent` on queue `q` (nil: the child's own).
local function parent_ref(id, parent, q)
  local rest = rel_rest(parent, id)
  if q then
    return rest and (q .. '::' .. rest) or (q .. ':' .. parent)
  end
  return rest and (':' .. rest) or parent
end

-- The parent's id and, when `p` names it, its queue (nil: the child's own,
-- or a row that holds it as `pq`), from child `id`'s `p` value `stored`.
local function parent_of(id, stored)
  if not stored or byte(stored, 1) == 58 then  -- ':'
    return stored and (id:sub(1, REL_PREFIX) .. stored:sub(2))
  end
  local cut = stored:find(':', 1, true)
  if not cut then
    return stored
  end
  if byte(stored, cut + 1) == 58 then
    return id:sub(1, REL_PREFIX) .. stored:sub(cut + 2), stored:sub(1, cut - 1)
  end
  return stored:sub(cut + 1), stored:sub(1, cut - 1)
end

-- A job added as pending holds no `s` (a default is not stored: 12 bytes
-- of every waiting row, docs/explanation/protocol.md#compact-rows); its
-- first move writes one. Every row holds its handler (`n`, or `name` in a
-- row an earlier version wrote), so every read of the state below gives a
-- row with a handler and no state 'pending', and one with neither false
-- (no row): row_hmget and row_hmget_s ask for the handler in the same
-- HMGET. row_read's callers ask for fields of their own: `got` is its
-- HMGET reply whose `at`-th value is the state and whose first `n` are the
-- row's fields; any other field there shows the row exists, else (a row
-- holding none of them, or none) one EXISTS asks.
local function pending_if_there(key, got, at, n)
  if got[at] then
    return got
  end
  for i = 1, n do
    if got[i] then
      got[at] = 'pending'
      return got
    end
  end
  if redis.call('EXISTS', key) == 1 then
    got[at] = 'pending'
  end
  return got
end

-- A child written at its flow's add time holds no `ca`: its parent's
-- incarnation (`pi`: the add's ms and 6 random digits) carries that time
-- (docs/explanation/protocol.md#compact-rows). The row's add time from its
-- `ca` and `pi` values (false for none).
local function created_of(ca, pinc)
  if ca then
    return ca
  end
  return pinc and #pinc > 6 and pinc:sub(1, -7) or false
end

-- Before a child's `pi` becomes `pinc` (a later add takes it under another
-- incarnation): a row that held no `ca` is given the time its old `pi` carried.
local function keep_created(key, pinc)
  local f = redis.call('HMGET', key, F_CREATED, LONG_NAME[F_CREATED], F_PINC)
  if not (f[1] or f[2]) and f[3] and f[3] ~= pinc and #f[3] > 6 then
    redis.call('HSET', key, F_CREATED, f[3]:sub(1, -7))
  end
end

-- HMGET of `key`'s fields ... (names as written now), in order (F_PARENT
-- as stored: row_hmget_p turns it into the whole id). A row written by an
-- earlier version (the only rows with a `name`: every version before
-- wrote it on every row, this one never does) is read again by both
-- names, the short one winning (this version may have written one into it
-- since: its `s` on a move, a re-added child's `pi`); a row of this
-- version costs one HMGET with two more fields (the marker and the
-- handler, which tells a pending row from none: pending_if_there).
local function row_hmget(key, ...)
  local got = redis.call('HMGET', key, 'name', F_NAME, ...)
  local n = select('#', ...)
  local there = got[1] or got[2]  -- its handler, by either name: the row exists
  if got[1] then
    local names = {...}
    for i = 1, n do
      names[n + i] = LONG_NAME[names[i]] or names[i]
    end
    got = redis.call('HMGET', key, unpack(names))
    for i = 1, n do
      got[i] = got[i] or got[n + i]
      got[n + i] = nil
    end
  else
    table.remove(got, 1)
    table.remove(got, 1)
  end
  if there then
    for i = 1, n do
      if select(i, ...) == F_STATE then
        got[i] = got[i] or 'pending'
        return got
      end
    end
  end
  return got
end

-- row_hmget for a read that asks for F_PARENT (once): its value is the
-- parent's whole id, and F_PQUEUE's (when asked) the parent's queue where
-- `p` names it (parent_of; `key` ends in the child's id, which holds no
-- ':'). Every read of F_PARENT goes through here, but claim's and
-- complete's, which call parent_of themselves (their hot paths: the
-- fields' places are known).
local function row_hmget_p(key, ...)
  local got = row_hmget(key, ...)
  local at, qat
  for i = 1, select('#', ...) do
    local name = select(i, ...)
    if name == F_PARENT then
      at = i
    elseif name == F_PQUEUE then
      qat = i
    end
  end
  if at and got[at] then
    local pid, q = parent_of(key:match('^.*:(.*)$'), got[at])
    got[at] = pid
    if q and qat then
      got[qat] = q
    end
  end
  return got
end

-- HMGET of the names in `fields` (F_STATE first, then a table ending in
-- 'name', the marker of a row an earlier version wrote: asked last, nothing
-- to shift out of the reply, where row_hmget asks it first); the values
-- without the marker. A row of an earlier version is read by both names
-- (row_hmget); one without a state is pending if it is there
-- (pending_if_there). The hot paths' reads (claim, complete).
local function row_read(key, fields)
  local n = #fields
  local f = redis.call('HMGET', key, unpack(fields))
  if f[n] then
    return row_hmget(key, unpack(fields, 1, n - 1))
  end
  f[n] = nil
  return pending_if_there(key, f, 1, n - 1)
end

-- row_hmget for a read of the state and fields that kept their names
-- (`s` first, then none of F_NAME ... F_PINC), on the hot paths: one
-- HMGET, with the handler, answers for a row of this version (its `s`, or
-- 'pending' for one that holds a handler and no state); a row without
-- either (one an earlier version wrote and this one never moved, or none)
-- is read again by row_hmget.
local function row_hmget_s(key, ...)
  local got = redis.call('HMGET', key, F_NAME, ...)
  local handler = table.remove(got, 1)
  if got[1] then
    return got
  elseif handler then  -- a row of this version added as pending
    got[1] = 'pending'
    return got
  end
  return row_hmget(key, ...)
end

-- The number a hex serial `rest` stands for (canonical: lower case, no
-- leading zero, at most 12 digits), or nil: a flow's generated ids are its
-- prefix and such a serial (lib/emit.lua run_text, child_entry's ranges).
local MAX_SERIAL = 0xffffffffffff  -- hex_of's largest: 12 digits
local function hex_of(rest)
  local n = rest and #rest <= 12 and tonumber(rest, 16)
  return n and n >= 0 and string.format('%x', n) == rest and n or nil
end

-- A parent's :children list holds each child as short as its queue and
-- the parent's id allow (docs/explanation/protocol.md#a-parents-keys):
--   ':' .. rest         on the parent's queue, its id sharing the parent's
--                       first REL_PREFIX bytes (rel_rest: a flow's
--                       generated ids), `rest` the child id's remainder
--   '<queue>::' .. rest the same on another queue
--   ':<a>:<b>', '<queue>::<a>:<b>'
--                       a range: the children whose rests count up from hex
--                       `a` to hex `b` (3 to 100 of them: RANGE_MAX; the host
--                       writes a flow's serial children so: core/rows.py
--                       child_entries), the parent's row counting its
--                       children in F_KIDS
--   '<id>'              on the parent's queue, any other id
--   '<queue>:<id>'      on another queue, any other id
--   P:{q}:job:<id>      the full key (lists written before the short forms:
--                       the only form with a '{')
-- Neither a queue name nor an id holds ':' or '{', so each form reads one
-- way; the lists written before the relative forms keep whole ids. The
-- child ref everywhere else (:processed and the other result hashes, outbox
-- entries) is the full key: child_keys turns list entries into them, given
-- the parent's id `pid` (the list's owner), and short_ref a full key into
-- the entry written now. `base` is the parent's P:{q}: (the list's own slot).

-- A range entry's queue ('' for the parent's), first and last serial; nil
-- for any other entry.
local function child_range(ref)
  local q, sep, a, b = ref:match('^([^:{]*)(::?)(%x+):(%x+)$')
  if q and (sep == ':') == (q == '') then
    return q, tonumber(a, 16), tonumber(b, 16)
  end
  return nil
end

local function child_key(base, pid, ref)
  if ref:find('{', 1, true) then
    return ref
  end
  local q, sep, rest = ref:match('^([^:]*)(::?)(.*)$')
  if not q then
    return base .. 'job:' .. ref
  end
  local id = (q == '' or sep == '::') and (pid:sub(1, REL_PREFIX) .. rest) or rest
  if q == '' then
    return base .. 'job:' .. id
  end
  return base:match('^(.-){') .. '{' .. q .. '}:job:' .. id
end

-- The full keys of list entries refs[from..to] (all when nil; any form,
-- a range's children in order).
local function child_keys(base, pid, refs, from, to)
  local out = {}
  for i = from or 1, to or #refs do
    local ref = refs[i]
    local q, a, b = child_range(ref)
    if q then
      local head = (q == '' and base or (base:match('^(.-){') .. '{' .. q .. '}:')) .. 'job:'
        .. pid:sub(1, REL_PREFIX)
      for n = a, b do
        out[#out + 1] = head .. string.format('%x', n)
      end
    else
      out[#out + 1] = child_key(base, pid, ref)
    end
  end
  return out
end

-- How many children list entries a[from..from+n-1] stand for.
local function child_count(a, from, n)
  local count = n
  for j = from, from + n - 1 do
    local q, lo, hi = child_range(a[j])
    if q then
      count = count + hi - lo
    end
  end
  return count
end

-- The entry for child `id` on queue `q` (nil: the parent's own) of parent `pid`.
local function child_entry(pid, q, id)
  local rest = rel_rest(id, pid)
  if rest then
    return (q and (q .. '::') or ':') .. rest
  end
  return q and (q .. ':' .. id) or id
end

local function short_ref(base, pid, key)
  local mine = base .. 'job:'
  if key:sub(1, #mine) == mine then
    return child_entry(pid, nil, key:sub(#mine + 1))
  end
  local q, id = key:match('{(.-)}:job:(.+)$')
  return q and child_entry(pid, q, id) or key  -- not a job key: left as it is
end

-- Whether parent `pid`'s :children list `kids` holds child key `key`, in
-- any form it was ever written in: short_ref's, the whole id's (the same
-- unless relative) and the full key's. One LPOS, two more for an entry
-- of a list written before; a list holding ranges (its parent counts its
-- children in F_KIDS) is read whole for a serial id it does not list alone.
local function child_listed(kids, base, pid, key)
  local entry = short_ref(base, pid, key)
  if redis.call('LPOS', kids, entry) then
    return true
  end
  local mine = base .. 'job:'
  local whole = (key:sub(1, #mine) == mine) and key:sub(#mine + 1)
    or key:gsub('^.-{(.-)}:job:(.+)$', '%1:%2')
  if whole ~= entry and redis.call('LPOS', kids, whole) then
    return true
  end
  if redis.call('LPOS', kids, key) then
    return true
  end
  local q, sep, rest = entry:match('^([^:]*)(::?)([^:]+)$')  -- a relative entry
  local n = q and (sep == ':') == (q == '') and hex_of(rest)
  if not n or redis.call('HEXISTS', kids:sub(1, #kids - #':children'), F_KIDS) == 0 then
    return false
  end
  for _, ref in ipairs(redis.call('LRANGE', kids, 0, -1)) do
    local rq, a, b = child_range(ref)
    if rq == q and a <= n and n <= b then
      return true
    end
  end
  return false
end
