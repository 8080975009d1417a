--[[
  lib/reports.lua: what running jobs reported, their progress values and job
  log lines (docs/explanation/protocol.md#progress-and-log-lines), written
  under their leases; inlined by the script loader where `@include
  lib/reports.lua` appears (write_reports, and complete, whose batch carries
  the writes its jobs left pending, written before any completion). Local
  definitions only; no key is touched until a script calls write_reports.

  write_reports(events, queue, base, keep, a, first): the entries of the
  flat array `a` from index `first` on, each a job's id, lease token, p and n
  (counts), its p progress values then its n lines (write_reports.lua's
  ARGV[4] says the shape). Each job is checked in turn under its lease
  (lib/lease.lua) exactly as if alone; a refused one writes nothing and does
  not stop the others. The last progress value replaces the row's
  `progress`; every value goes to `events` once for the whole call (a single
  value as p=, several as entries of at most PER_ENTRY values, id=<one id a
  value> ps=<a JSON array>); lines go to the job log (write_lines), kept to
  the newest `keep`. Returns the table of each entry's held count (the
  lines its log held once its lines were added, 0 for none, -1 refused)
  and the table of the refusals' error strings, in order. `hold`, when
  given (complete.lua): `read(id, row)` answers a completing job's row
  read, or nil for another job, with its row's `lg` at index `hold.lg_at`;
  `progress` and `lg` take those jobs' last progress values and new `lg`
  lines, for their completions' own HSET.
]]
-- @include lib/emit.lua
-- @include lib/lease.lua
-- @include lib/row.lua

-- progress values a batched events entry carries at most (bounds its size:
-- 100 values of at most 1,024 bytes)
local PER_ENTRY = 100

-- bytes of a line the row keeps at most: Redis keeps a hash a listpack while
-- each value is at most 64 bytes (hash-max-listpack-value's default) and
-- turns it into a hashtable for good past that, several times its size
local ROW_LINE = 64

-- Append a[from .. to] (lines) to the job log of the job row `row`, whose
-- read `f` holds at index `at` the row's `lg`; keep the newest `keep`
-- (docs/explanation/protocol.md#progress-and-log-lines). With `lg` the log
-- is `lg`, its oldest line, then the list <row>:logs; without it the log is
-- the list alone (empty, or its oldest line longer than ROW_LINE). A log
-- of one short line, the usual one, is one more field of a row written
-- anyway, with no key of its own. Returns the lines the log held once they
-- were added (before the trim) and how `lg` changes, for the caller to
-- write: nil (it does not), a line (set it) or false (remove it); f[at]
-- holds the new `lg` already, for a later entry of the same job in the call.
local function write_lines(row, f, at, keep, a, from, to)
  local logs, lg, held = row .. ':logs', f[at], nil
  if lg then
    held = 1 + redis.call('RPUSH', logs, unpack(a, from, to))
  elseif #a[from] <= ROW_LINE and redis.call('LLEN', logs) == 0 then
    lg, held = a[from], to - from + 1  -- an empty log: its first line to the row
    if held > 1 then
      redis.call('RPUSH', logs, unpack(a, from + 1, to))
    end
  else
    held = redis.call('RPUSH', logs, unpack(a, from, to))
  end
  if held > keep then  -- the newest `keep`: the oldest of them to the row, when short
    local first = redis.call('LINDEX', logs, -keep)
    if #first > ROW_LINE then
      lg = false
      redis.call('LTRIM', logs, -keep, -1)
    elseif keep == 1 then
      lg = first
      redis.call('DEL', logs)
    else
      lg = first
      redis.call('LTRIM', logs, 1 - keep, -1)
    end
  end
  if lg == f[at] or (lg == false and not f[at]) then
    return held, nil
  end
  f[at] = lg or nil
  return held, lg
end

local function write_reports(events, queue, base, keep, a, first, hold)
  local ids, values = {}, {}  -- the call's accepted progress values, and whose
  local held_by_entry, refusals = {}, {}
  local i = first
  while i <= #a do
    local id, token = a[i], a[i + 1]
    local p, n = a[i + 2], a[i + 3]
    local row = base .. 'job:' .. id
    local f, lg_at = hold and hold.read(id, row), 3
    local held_row = f and true
    if f then
      lg_at = hold.lg_at
    else
      f = row_hmget_s(row, F_STATE, 'lease', 'lg')
    end
    local refused = lease_refused(queue, id, f[1], f[2], token)
    if refused then
      held_by_entry[#held_by_entry + 1] = -1
      refusals[#refusals + 1] = refused['err']
    else
      for at = i + 4, i + 3 + p do
        ids[#ids + 1] = id
        values[#values + 1] = a[at]
      end
      if p > 0 then
        if held_row then
          hold.progress[id] = a[i + 3 + p]
        else
          redis.call('HSET', row, 'progress', a[i + 3 + p])
        end
      end
      local held = 0
      if n > 0 then
        local lg
        held, lg = write_lines(row, f, lg_at, keep, a, i + 4 + p, i + 3 + p + n)
        if lg and held_row then
          hold.lg[id] = lg  -- in its completion's own HSET
        elseif lg then
          redis.call('HSET', row, 'lg', lg)
        elseif lg == false then
          redis.call('HDEL', row, 'lg')
          if held_row then
            hold.lg[id] = nil
          end
        end
      end
      held_by_entry[#held_by_entry + 1] = held
    end
    i = i + 4 + p + n
  end
  for from = 1, #values, PER_ENTRY do
    local to = math.min(from + PER_ENTRY - 1, #values)
    if from == to then
      emit_to(events, 'progress', ids[from], 'p', values[from])
    else
      emit_to(events, 'progress', run_text(ids, from, to),
        'ps', '[' .. table.concat(values, ',', from, to) .. ']')
    end
  end
  return held_by_entry, refusals
end
