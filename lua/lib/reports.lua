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
  value> ps=<a JSON array>); lines are RPUSHed to P:{q}:job:<id>:logs and
  LTRIMmed to the newest `keep`. Returns the table of each entry's held
  count (the lines its log held once its lines were added, 0 for none, -1
  refused) and the table of the refusals' error strings, in order.
]]
-- @include lib/emit.lua
-- @include lib/lease.lua
-- @include lib/row.lua

-- progress values a batched events entry carries at most (bounds its size:
-- 100 values of at most 1,024 bytes)
local PER_ENTRY = 100

local function write_reports(events, queue, base, keep, a, first, hold)
  local ids, values = {}, {}  -- the call's accepted progress values, and whose
  local held_by_entry, refusals = {}, {}
  local i = first
  while i <= #a do
    local id, token = a[i], a[i + 1]
    local p, n = a[i + 2], a[i + 3]
    local row = base .. 'job:' .. id
    local f = hold and hold.read(id, row)
    local held_row = f and true
    if not f then
      f = row_hmget_s(row, F_STATE, 'lease')
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
        local logs = row .. ':logs'
        held = redis.call('RPUSH', logs, unpack(a, i + 4 + p, i + 3 + p + n))
        if held > keep then
          redis.call('LTRIM', logs, -keep, -1)
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
