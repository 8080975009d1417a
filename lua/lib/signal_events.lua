--[[
  lib/signal_events.lua: durable signal events (docs/explanation/signals.md), inlined by the
  script loader wherever `@include lib/signal_events.lua` appears (lib/flow.lua includes
  it, so every script that includes lib/flow.lua has it too). Not a script:
  it defines local functions only and touches no key until called.

  signal_event(base, kind, id, value) records one transition a user acts on,
  in the same script as the transition, so the transition never happens
  without its event:

    kind          signal it becomes       value
    completed     job_completed           the result (JSON text)
    dead          job_dead                the error
    released      parent_released         nil
    flow_failed   flow_failed             the parent's error
    cancelled     job_cancelled           the error ('cancelled': kill records it
                                          before the death, docs/explanation/lifecycle.md)

  The event is XADDed to `P:{q}:signals` (a stream on the queue's own slot)
  as fields k=<kind>, id=<job id>, n=<job name>[, v=<value>]; its stream id
  is the event's id. Nothing trims that stream: the dispatcher
  (echomq_django/runners/dispatcher.py) deletes an entry only once every receiver
  returned (or it went to the dead-letter), so the stream is bounded by
  dispatch.

  Cost rule: a kind is recorded only when it is in the set
  `P:{q}:signals:kinds`, which every worker, pump and dispatcher adds to
  when it starts, with the kinds its process has receivers connected for (all
  processes of one Django project connect the same ones). A site without
  receivers pays one SMEMBERS per script run and writes nothing; a
  completion costs an event only when a `job_completed` receiver exists.
]]

local SIGNAL_KINDS = {}  -- base -> {kind = true}, read once per script run

local function signal_event(base, kind, id, value)
  local kinds = SIGNAL_KINDS[base]
  if kinds == nil then
    kinds = {}
    for _, k in ipairs(redis.call('SMEMBERS', base .. 'signals:kinds')) do
      kinds[k] = true
    end
    SIGNAL_KINDS[base] = kinds
  end
  if not kinds[kind] then
    return
  end
  local name = row_hmget(base .. 'job:' .. id, F_NAME)[1] or ''
  if value then
    redis.call('XADD', base .. 'signals', '*', 'k', kind, 'id', id, 'n', name, 'v', value)
  else
    redis.call('XADD', base .. 'signals', '*', 'k', kind, 'id', id, 'n', name)
  end
end
