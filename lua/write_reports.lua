--[[
  write_reports: what running jobs of one queue reported, their progress and
  job log lines (docs/explanation/protocol.md#progress-and-log-lines), for
  one job or a batch: a worker gathers its handlers' writes and sends them
  in one call per queue. Each job is checked in turn exactly as if alone,
  under its lease as extend_lease is (lib/lease.lua), and touches nothing
  extend_lease touches (the `active` zset): a write never races a
  heartbeat. A refused job writes nothing and does not stop the others.
  The last progress value of a job replaces the row's `progress` field, and
  every value goes to the events stream (lib/emit.lua, capped like every
  entry there), once for the whole call: a single value as e=progress
  id=<id> p=<value>; several (of one job or many) as entries of at most
  PER_ENTRY values, e=progress id=<the ids, space-separated, one per value,
  in the order written> ps=<a JSON array of the values, in the same order>
  (docs/howto/events.md#what-an-event-holds). Lines go to the job log, kept
  to the newest `keep` lines, so it never holds more: its oldest line is the
  row's field `lg`, the others the list P:{q}:job:<id>:logs (lib/reports.lua
  write_lines). The log is a part of the row, removed with it on every road
  that deletes a row (lib/lifecycle.lua, lib/flow.lua, drop_unprocessed).

  KEYS[1] events stream        P:{q}:events

  ARGV[1] queue name
  ARGV[2] queue key prefix     P:{q}: (job rows are P:{q}:job:<id>, same slot)
  ARGV[3] lines kept (KEEP_LOGS, an integer >= 1)
  ARGV[4] the jobs, one JSON array (decoded by cjson: one argument instead
          of six a job, which the client packs far more cheaply), flat: for
          each job its id, lease token (from claim), p and n (counts, >= 0),
          then p progress values in the order reported (JSON texts the host
          checked, at most core/live.MAX_PROGRESS_BYTES bytes each, as JSON
          strings: the events carry each, the row keeps the last), then n
          lines (strings the host cut to at most core/live.MAX_LOG_LINE_BYTES
          bytes each)

  The work is lib/reports.lua's, which complete.lua shares (a completing
  job's pending writes ride its completion).

  returns: an array: first one string, the entries' answers in order,
           space-separated: the number of lines its job log held once its
           lines were added, before the trim (0 when it sent none), or -1
           when the job was refused (nothing written for it); then the
           error string of each refused entry, in order (one string to
           parse instead of an array entry a job, which cost the client
           more than the rest of the reply):
             EMQNOJOB <queue> <id>            no such job
             EMQSTATE <queue> <id> <state>    the job is not active
             EMQLEASE <queue> <id>            the lease token is stale
  errors:  none: a refusal is its entry's answer in the reply
]]
local events = KEYS[1]
local queue, base, keep = ARGV[1], ARGV[2], tonumber(ARGV[3])
-- @include lib/reports.lua

local held_by_entry, refusals = write_reports(events, queue, base, keep, cjson.decode(ARGV[4]), 1)
local replies = {table.concat(held_by_entry, ' ')}
for _, err in ipairs(refusals) do
  replies[#replies + 1] = err
end
return replies
