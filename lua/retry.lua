--[[
  retry: retry-by-id of a dead job (docs/explanation/protocol.md#retry). Attempts and stalls reset, back
  to pending; its start deadline (`expires_at`, docs/howto/retries.md#expiry-before-start) goes. A dead parent that children failed (`fp`) retries those
  children instead: same-queue ones here, recursively; it returns to
  awaiting_children once none is left in its :failed. A retried child
  re-attaches to a parent it had failed (here, or via a `reattach` outbox
  entry for a parent on another slot). A job that died `cancelled` takes
  its cancel back (uncancel, below) and, with children still unresolved,
  returns to awaiting_children rather than pending
  (docs/explanation/lifecycle.md#a-retry-takes-a-cancel-back).

  KEYS[1] job row              P:{q}:job:<id>
  KEYS[2] dead zset            P:{q}:dead
  KEYS[3] pending list         P:{q}:pending

  ARGV[1] queue name
  ARGV[2] queue key prefix     P:{q}:
  ARGV[3] job id
  ARGV[4] now (ms)
  ARGV[5] call token: a fresh random string per retry call, kept on the row so
          a replay of the same call is recognised

  returns: JSON {cross: [child refs on other slots the host must retry],
           retried: [P:{q}:id...], revived, reattach, released, dead,
           flow_failed, outbox}
  errors:  EMQNOJOB <queue> <id>            no such job
           EMQSTATE <queue> <id> <state>    the job is not dead (unless this
           very call already retried it: a replay with the same token answers
           as if it had worked)
           EMQPARENT <queue> <id> <parent queue> <parent id> <state>  the
           job's parent ignored its death (`id`) and has been released since:
           it went on without the job; nothing is written
]]
local row, dead = KEYS[1], KEYS[2]
local QUEUE = ARGV[1]
-- @include lib/flow.lua
local base, id, now = ARGV[2], ARGV[3], tonumber(ARGV[4])

local state = row_hmget_s(row, F_STATE)[1]
if not state then
  return redis.error_reply('EMQNOJOB ' .. QUEUE .. ' ' .. id)
end
if state ~= 'dead' then
  if (state == 'pending' or state == 'awaiting_children')
      and redis.call('HGET', row, 'retry_token') == ARGV[5] then
    return cjson.encode(OUT)  -- a replay of this very call (redis-py re-sent it): done
  end
  return redis.error_reply('EMQSTATE ' .. QUEUE .. ' ' .. id .. ' ' .. state)
end

-- A child its parent ignored (`id`) re-attaches on retry only while that
-- parent has not been released (lib/flow.lua reattach_ignored); a parent on
-- this slot that went on without it makes the retry a refusal, before any
-- write (docs/explanation/reliability.md#a-retried-child-its-parent-ignored).
local up = row_hmget_p(row, F_PARENT, F_PQUEUE, F_POLICY)
if up[1] and up[3] == 'id' and (up[2] or QUEUE) == QUEUE then
  local pkey = job_key(base, up[1])
  local pstate = row_hmget_s(pkey, F_STATE)[1]
  if pstate and pstate ~= 'awaiting_children' and pstate ~= 'dead'
      and redis.call('HEXISTS', pkey .. ':unsuccessful', child_ref(base, id)) == 1 then
    return redis.error_reply('EMQPARENT ' .. QUEUE .. ' ' .. id .. ' ' .. QUEUE .. ' '
      .. up[1] .. ' ' .. pstate)
  end
end

OUT.cross = {}
OUT.retried = {}
local mine = base .. 'job:'

-- A cancelled job's retry takes its cancel back first (uncancel, lib/flow.lua).

local function retry_job(jid)
  local key = job_key(base, jid)
  local failed = redis.call('HKEYS', key .. ':failed')
  local f = redis.call('HMGET', key, 'error', 'went_on')
  if f[1] == 'cancelled' then
    uncancel(base, jid, key)
  end
  if #failed == 0 and f[1] == 'cancelled' and not f[2]
      and tonumber(redis.call('GET', key .. ':dependencies') or '0') > 0 then
    -- cancelled while children were still unresolved (running, or their
    -- deaths still on their way): it waits for them again, it never runs
    -- without their results
    redis.call('ZREM', dead, jid)
    redis.call('ZADD', base .. 'awaiting', now, jid)
    redis.call('HSET', key, F_STATE, 'awaiting_children', 'attempts', 0, 'stalls', 0,
      'updated_at', now, 'retry_token', ARGV[5])
    redis.call('HDEL', key, 'finished_at', 'cancel', 'expires_at')
    clear_error(key)
    redis.call('ZREM', base .. 'expire', jid)
    local deadline = redis.call('HGET', key, 'children_deadline')
    if deadline then  -- held again, under the deadline it had (a sweep while dead dropped it)
      redis.call('ZADD', base .. 'deadlines', deadline, jid)
    end
    emit(base, 'retried', jid)
    OUT.revived[#OUT.revived + 1] = base .. jid
    reattach_up(base, jid, now)
    return
  end
  if #failed == 0 then
    redis.call('ZREM', dead, jid)
    redis.call('HSET', key, F_STATE, 'pending', 'attempts', 0, 'stalls', 0, 'updated_at', now,
      'retry_token', ARGV[5])
    redis.call('HDEL', key, 'finished_at', 'result', 'cancel', 'expires_at')
    clear_error(key)
    redis.call('ZREM', base .. 'expire', jid)
    make_claimable_row(base, jid)
    emit(base, 'retried', jid)
    OUT.retried[#OUT.retried + 1] = base .. jid
    reattach_up(base, jid, now)
    return
  end
  for _, ref in ipairs(failed) do
    if ref:sub(1, #mine) == mine then
      local cid = ref:sub(#mine + 1)
      if row_hmget(job_key(base, cid), F_STATE)[1] == 'dead' then
        retry_job(cid)
      else
        reattach(base, jid, ref, now)
      end
    else
      OUT.cross[#OUT.cross + 1] = ref
    end
  end
end

retry_job(id)
redis.call('HSET', row, 'retry_token', ARGV[5])
return cjson.encode(OUT)
